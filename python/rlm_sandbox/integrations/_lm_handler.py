"""A client for the RLM library's LM handler socket, written from its protocol (stdlib only).

The library's ``LMHandler`` listens on a TCP address it hands to environments
(``lm_handler_address``). One request per connection: a 4-byte big-endian length, then that
many bytes of UTF-8 JSON; the answer is framed the same way, then the server closes.

Request: ``{"prompt": str | [messages], "model"?: str, "depth": int}`` (or ``"prompts"`` for a
batch). Answer: ``{"chat_completion": {...}}`` (``root_model``, ``prompt``, ``response``,
``usage_summary``, ``execution_time``) or ``{"error": "..."}``.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any, Dict, Optional, Tuple

#: The largest answer accepted from a handler (a completion's JSON), in bytes.
MAX_ANSWER_BYTES = 256 * 1024 * 1024

#: How long one request may take (the library's own default socket timeout), in seconds.
DEFAULT_TIMEOUT = 300.0


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks = []
    left = size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError("the LM handler closed the connection mid-answer")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def request(address: Tuple[str, int], message: Dict[str, Any],
            timeout: Optional[float] = DEFAULT_TIMEOUT) -> Dict[str, Any]:
    """Sends one request to the handler at ``address`` and returns its decoded answer.

    Raises ``OSError``/``ConnectionError`` when the handler cannot be reached or hangs up,
    ``ValueError`` when its answer is not a JSON object of at most ``MAX_ANSWER_BYTES``.
    """
    payload = json.dumps(message).encode("utf-8")
    with socket.create_connection((address[0], int(address[1])), timeout=timeout) as sock:
        sock.sendall(struct.pack(">I", len(payload)) + payload)
        header = _recv_exactly(sock, 4)
        (length,) = struct.unpack(">I", header)
        if length > MAX_ANSWER_BYTES:
            raise ValueError(f"the LM handler's answer is {length} bytes, over the "
                             f"{MAX_ANSWER_BYTES}-byte limit")
        answer = json.loads(_recv_exactly(sock, length).decode("utf-8"))
    if not isinstance(answer, dict):
        raise ValueError("the LM handler's answer is not a JSON object")
    return answer
