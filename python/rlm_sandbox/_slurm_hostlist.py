"""A Slurm job's node list, as Slurm writes it in ``SLURM_JOB_NODELIST``, expanded to host names:
``"node[01-03,07],gpu5,rack[1-2]-n[1-2]"`` is node01 node02 node03 node07 gpu5 rack1-n1 rack1-n2
rack2-n1 rack2-n2 (a range keeps its lower bound's digits: 01-03 is 01, 02, 03).

The same expansion as the C++ client's (runtime/server/slurm_hostlist.cpp), so that
``slurm:PORT`` names the same nodes from either client.
"""

from __future__ import annotations

import itertools
from typing import List, NamedTuple

from .result import RlmSandboxError

#: Hosts a list may name at most: a fleet's endpoints at most (fleet.py's _MAX_ENDPOINTS).
MAX_HOSTS = 100_000
#: A DNS name's longest.
_MAX_HOST_BYTES = 253
#: Digits of a range's bound at most: 18 fit a 64-bit count with room to spare, as in C++.
_MAX_DIGITS = 18
_DIGITS = frozenset("0123456789")
#: What a literal piece of a host name may hold (ASCII only: no locale's idea of a letter).
_HOST_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                             "0123456789-._")


class _Range(NamedTuple):
    first: int
    last: int
    width: int  # digits of the lower bound: zero-padded to it


def _malformed(text: str, why: str) -> RlmSandboxError:
    return RlmSandboxError(f"the Slurm node list '{text[:200]}': {why}")


def _split_outside_brackets(text: str) -> List[str]:
    """`text` split at the commas outside brackets (brackets do not nest in a node list)."""
    parts: List[str] = []
    start = 0
    inside = False
    for i, c in enumerate(text):
        if c == "[":
            inside = True
        elif c == "]":
            inside = False
        elif c == "," and not inside:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _all_digits(text: str) -> bool:
    return 0 < len(text) <= _MAX_DIGITS and all(c in _DIGITS for c in text)


def _ranges_of(text: str, body: str) -> List[_Range]:
    """``"01-03,7"`` (a bracket group's body) into its ranges."""
    ranges: List[_Range] = []
    for part in _split_outside_brackets(body):
        low, dash, high = part.partition("-")
        if not dash:
            high = low
        if not _all_digits(low) or not _all_digits(high):
            raise _malformed(text, f"'[{body}]' is not numbers and ranges of them")
        bounds = _Range(int(low), int(high), len(low))
        if bounds.last < bounds.first:
            raise _malformed(text, f"the range {part} runs backwards")
        ranges.append(bounds)
    return ranges


def _expand_item(text: str, item: str, hosts: List[str], max_hosts: int) -> None:
    """One comma-free item (``"rack[1-2]-n[01-02]"``) into its hosts, appended to `hosts`."""
    # The item as literal pieces between bracket groups, and the groups' ranges.
    pieces: List[str] = []
    groups: List[List[_Range]] = []
    at = 0
    while True:
        opening = item.find("[", at)
        if opening < 0:
            pieces.append(item[at:])
            break
        closing = item.find("]", opening)
        if closing < 0:
            raise _malformed(text, "a '[' is not closed")
        pieces.append(item[at:opening])
        groups.append(_ranges_of(text, item[opening + 1:closing]))
        at = closing + 1
    for piece in pieces:
        if not all(c in _HOST_CHARACTERS for c in piece):
            raise _malformed(text, f"'{item}' is not a host name")
    # How many hosts this item makes, before making any: "n[0-999999999]" costs nothing. An item
    # without brackets (one host) is counted too, so that no list gives more than max_hosts.
    count = 1
    for ranges in groups:
        count *= sum(bounds.last - bounds.first + 1 for bounds in ranges)
        if len(hosts) + count > max_hosts:
            break
    if len(hosts) + count > max_hosts:
        raise _malformed(text, f"more than {max_hosts} hosts")
    # Every number of each group, zero-padded; the last group turns fastest (Slurm's order).
    numbers = [[str(value).zfill(bounds.width)
                for bounds in ranges for value in range(bounds.first, bounds.last + 1)]
               for ranges in groups]
    for values in itertools.product(*numbers):
        host = pieces[0] + "".join(value + piece for value, piece in zip(values, pieces[1:]))
        if not host or len(host) > _MAX_HOST_BYTES:
            raise _malformed(text, f"a host name of {len(host)} bytes")
        hosts.append(host)


def expand_slurm_hostlist(text: str, max_hosts: int = MAX_HOSTS) -> List[str]:
    """The hosts of the Slurm node list `text`, in its order.

    Raises:
        RlmSandboxError: a malformed list (an unclosed bracket, a range that
            runs backwards or is not digits, a name with characters no host name has), one with
            no hosts, or one of more than `max_hosts` hosts (counted before any is made).
    """
    hosts: List[str] = []
    for item in _split_outside_brackets(text):
        item = item.strip(" \n")
        if item:
            _expand_item(text, item, hosts, max_hosts)
    if not hosts:
        raise _malformed(text, "no hosts in it")
    return hosts
