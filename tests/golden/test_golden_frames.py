"""The golden-frame corpus (README.md here) through the Python ends of the three protocols: the
REPL worker's control channel (worker/python/channel.py, in the script the runtime embeds), the
client package's server wire (python/rlm_sandbox/_wire.py) and its repl request lines
(python/rlm_sandbox/_process.py). The same files go through the C++ ends in
golden_frames_test.cpp."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import unittest
from typing import Any, Callable, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, '..', '..')
sys.path.insert(0, os.path.join(ROOT, 'python'))
sys.path.insert(0, os.path.join(ROOT, 'tests', 'python_worker'))
from rlm_sandbox._process import _encode as encode_repl_line  # noqa: E402
from rlm_sandbox._wire import ServerError, Wire  # noqa: E402
from worker_host import SOURCE as WORKER_SOURCE  # noqa: E402


class Refused(Exception):
    """What the worker's protocol_violation raises here instead of exiting."""


def worker_namespace() -> Dict[str, Any]:
    """The worker script's globals, its main() not run; a protocol violation raises Refused."""
    namespace: Dict[str, Any] = {'__name__': 'rlm_worker_golden'}
    exec(compile(WORKER_SOURCE, 'rlm_worker.py', 'exec'), namespace)

    def refuse(message: str):
        raise Refused(message)

    namespace['protocol_violation'] = refuse
    return namespace


WORKER = worker_namespace()


def corpus(name: str) -> Dict[str, Any]:
    with open(os.path.join(HERE, name + '.json'), encoding='utf-8') as source:
        return json.load(source)


def lists(entry: Dict[str, Any], key: str, side: str) -> bool:
    """Whether the entry lists `side` under `key` (absent: both sides)."""
    return side in entry.get(key, ('cpp', 'python'))


def wire_bytes(segments: List[Dict[str, Any]]) -> bytes:
    data = bytearray()
    for segment in segments:
        piece = (bytes.fromhex(segment['hex']) if 'hex' in segment
                 else segment['utf8'].encode('utf-8'))
        data += piece * segment.get('times', 1)
    return bytes(data)


def expanded(value: Any) -> Any:
    """The message with each {"$repeat": text, "times": n} replaced by text * n."""
    if isinstance(value, dict):
        if '$repeat' in value:
            return value['$repeat'] * value['times']
        return {key: expanded(item) for key, item in value.items()}
    if isinstance(value, list):
        return [expanded(item) for item in value]
    return value


def write_then_close(sock: socket.socket, data: bytes, shut: bool = True) -> threading.Thread:
    """Writes data on sock from a thread (it may exceed the socket's buffer), then shuts down
    the writing side unless `shut` is false; a reader that gave up (closed) ends the writing."""
    def run():
        try:
            sock.sendall(data)
            if shut:
                sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    while True:
        chunk = sock.recv(1 << 20)
        if not chunk:
            return b''.join(chunks)
        chunks.append(chunk)


def round_trip_valid_frames(test: unittest.TestCase, doc: Dict[str, Any],
                            decode: Callable[[bytes], Dict[str, Any]],
                            encode: Callable[[Dict[str, Any]], bytes]) -> None:
    """Each valid frame of a corpus through one side: decode(wire) gives its message,
    encode(message) gives its wire, each where the entry lists Python."""
    for entry in doc['valid']:
        with test.subTest(entry['name']):
            wire = wire_bytes(entry['wire'])
            message = expanded(entry['message'])
            if lists(entry, 'decoded_by', 'python'):
                test.assertEqual(decode(wire), message)
            if lists(entry, 'encoded_by', 'python'):
                test.assertEqual(encode(message), wire)


class ControlChannel(unittest.TestCase):
    """The worker's end: it encodes the frames it sends (bulk frames included) and decodes the
    host's."""

    def setUp(self):
        self.doc = corpus('control_channel')

    def worker_sends(self, message: Dict[str, Any]) -> bytes:
        worker_end, host_end = socket.socketpair()
        channel = WORKER['Channel'](worker_end, self.doc['max_frame'])
        with host_end:
            sender = threading.Thread(target=lambda: (channel.send(message),
                                                      worker_end.shutdown(socket.SHUT_WR)))
            sender.start()
            data = read_all(host_end)
            sender.join()
        channel.close()
        return data

    def worker_receives(self, data: bytes):
        """The one frame in data as the worker's channel cuts and decodes it (its reading loop
        also files the frame by op, which this does not need)."""
        buffer = bytearray(data)
        body = WORKER['take_frame'](buffer, self.doc['max_frame'])
        self.assertIsNotNone(body, 'the frame is incomplete')
        self.assertEqual(buffer, b'', 'more than one frame')
        return WORKER['decode_frame'](body)

    def test_valid_frames_round_trip(self):
        def decode(wire: bytes) -> Dict[str, Any]:
            frame = self.worker_receives(wire)
            self.assertIsNone(frame.fd)
            return dict(frame)

        round_trip_valid_frames(self, self.doc, decode, self.worker_sends)

    def test_invalid_frames_are_refused(self):
        for entry in self.doc['invalid']:
            if not lists(entry, 'refused_by', 'python'):
                continue
            with self.subTest(entry['name']):
                with self.assertRaises(Refused):
                    self.worker_receives(wire_bytes(entry['wire']))


class ServerWire(unittest.TestCase):
    """The client package's end: it encodes requests and decodes replies; the framing is the
    same both ways, so every frame goes through both."""

    def setUp(self):
        self.doc = corpus('server_wire')

    def test_valid_frames_round_trip(self):
        def decode(wire: bytes) -> Dict[str, Any]:
            mine, theirs = socket.socketpair()
            writer = write_then_close(theirs, wire)
            wire_end = Wire(mine)
            try:
                return wire_end.receive()
            finally:
                wire_end.close()
                writer.join()
                theirs.close()

        def encode(message: Dict[str, Any]) -> bytes:
            mine, theirs = socket.socketpair()
            wire_end = Wire(mine)
            with theirs:
                wire_end.send(message)
                mine.shutdown(socket.SHUT_WR)
                data = read_all(theirs)
            wire_end.close()
            return data

        round_trip_valid_frames(self, self.doc, decode, encode)

    def test_invalid_frames_are_refused(self):
        for entry in self.doc['invalid']:
            if not lists(entry, 'refused_by', 'python'):
                continue
            with self.subTest(entry['name']):
                mine, theirs = socket.socketpair()
                writer = write_then_close(theirs, wire_bytes(entry['wire']))
                wire_end = Wire(mine)
                try:
                    with self.assertRaises(ServerError):
                        wire_end.receive()
                finally:
                    wire_end.close()
                    writer.join()
                    theirs.close()


class ReplLines(unittest.TestCase):
    """The client package writes the orchestrator's lines; it reads none of the requests, so it
    has no refusals to check (the C++ parser refuses the invalid lines)."""

    def test_valid_lines_encode_byte_identically(self):
        doc = corpus('repl_lines')
        for entry in doc['valid']:
            with self.subTest(entry['name']):
                self.assertEqual(json.loads(entry['line']), entry['request'])
                self.assertEqual(encode_repl_line(entry['request']),
                                 entry['line'].encode('utf-8') + b'\n')


if __name__ == '__main__':
    unittest.main()
