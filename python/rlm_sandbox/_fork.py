"""fork(n) for both clients: one save of the parent into a private temporary directory, then n
fresh sessions (each its own sandbox) opened and loaded from that file concurrently, as
``rlm::fork_session`` does in C++ (runtime/include/rlm_sandbox/session.hpp)."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from typing import Any, Callable, Dict, List, Optional, TypeVar

from ._requests import loaded
from .result import CellResult, RlmSandboxError

#: The most branches one fork makes (``rlm::kMaxForkBranches``).
MAX_FORK_BRANCHES = 64
#: The prefix of the temporary directory a fork saves its parent into (removed on every path).
TEMP_PREFIX = "rlm-sandbox-fork-"

#: Per branch index, constructor arguments that replace the parent's (e.g. the callbacks of the
#: object the branch will belong to); None: the parent's own.
BranchOptions = Optional[Callable[[int], Dict[str, Any]]]

Branch = TypeVar("Branch")


def checked_count(count: Any) -> int:
    """A fork's branch count as given: an int from 1 to MAX_FORK_BRANCHES, else ValueError."""
    if isinstance(count, bool) or not isinstance(count, int) or \
            not 1 <= count <= MAX_FORK_BRANCHES:
        raise ValueError(f"a fork makes 1 to {MAX_FORK_BRANCHES} branches, not {count!r}")
    return count


def fork_branches(count: int, save: Callable[[str], CellResult],
                  open_branch: Callable[[int], Branch],
                  load: Callable[[Branch, str], CellResult],
                  close: Callable[[Branch], None]) -> List[Branch]:
    """`count` branches holding the state `save` writes: `save(path)` once, then, on a thread
    per branch, `open_branch(index)` and `load(branch, path)`. When any branch fails, every
    branch opened is closed and RlmSandboxError names the failed ones. The save file's
    directory is removed on every path."""
    count = checked_count(count)
    directory = tempfile.mkdtemp(prefix=TEMP_PREFIX)
    try:
        path = os.path.join(directory, "parent.save")
        saved = save(path)
        if not saved.ok:
            raise RlmSandboxError(f"the session's state could not be saved for the fork: "
                                  f"{saved.status}: {saved.error or ''}".rstrip(": "))
        branches: List[Optional[Branch]] = [None] * count
        errors: List[Optional[BaseException]] = [None] * count

        def make(index: int) -> None:
            try:
                branch = open_branch(index)
                branches[index] = branch  # closed with the others should a branch fail
                loaded(load(branch, path), path)
            except Exception as error:  # noqa: BLE001 - reported for this branch below
                errors[index] = error
            except BaseException as error:  # an interrupt: recorded, and it goes on
                errors[index] = error
                raise

        threads = [threading.Thread(target=make, args=(index,), name=f"rlm-fork-{index}")
                   for index in range(1, count)]
        started: List[threading.Thread] = []
        try:
            for thread in threads:
                thread.start()
                started.append(thread)
            make(0)
            for thread in started:
                thread.join()
        except BaseException:  # a thread that would not start, an interrupt: no branch stays
            for thread in started:
                thread.join()
            _close_all(branches, close)
            raise
        failed = [index for index, error in enumerate(errors) if error is not None]
        if failed:
            _close_all(branches, close)
            what = "; ".join(f"branch {index}: {_describe(errors[index])}" for index in failed)
            raise RlmSandboxError(
                f"{len(failed)} of the fork's {count} branches failed (the branches opened "
                f"were closed): {what}") from errors[failed[0]]
        return [branch for branch in branches if branch is not None]
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _describe(error: Optional[BaseException]) -> str:
    text = str(error) if error is not None else ""
    return text or type(error).__name__


def _close_all(branches: List[Any], close: Callable[[Any], None]) -> None:
    for branch in branches:
        if branch is None:
            continue
        try:
            close(branch)
        except Exception:  # noqa: BLE001 - the branch's failure is the one to raise
            pass
