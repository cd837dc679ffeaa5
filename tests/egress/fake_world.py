#!/usr/bin/env python3
"""The internet, faked for the egress tests: a DNS resolver and upstream servers on addresses of
the test's own network namespace (tests/egress/egress_world.hpp starts it there). Nothing here
is the code under test: DNS is hand-built from RFC 1035, TLS is Python's ssl module.

  fake_world.py DIR RESOLVER_PORT NAME=ADDRESS...

Every query the resolver gets is appended to DIR/queries.log ("NAME TYPE" a line); every
request head an upstream gets, to DIR/requests.log, the value of each Authorization or X-Api-Key
header as "sha256:<hex>" (the tests' injected secrets must be found nowhere a sandbox can read,
and DIR is bound into the sandbox). Upstreams:
  203.0.113.10:443  TLS (DIR/server.pem, DIR/server.key), answers "tls ok" and its SNI
  203.0.113.11:80   HTTP, answers "http ok Host=<host>" to each request
  203.0.113.12:5432 TCP echo
  203.0.113.13:9000 TCP sink: counts bytes, answers the count on EOF
  127.0.0.1:5432    TCP echo (rebind.test's answer: a private address)
Prints "ready" once every socket listens.
"""
import hashlib
import os
import socket
import ssl
import struct
import sys
import threading

DIR = sys.argv[1]
RESOLVER_PORT = int(sys.argv[2])
ANSWERS = dict(entry.split("=", 1) for entry in sys.argv[3:])
LOCK = threading.Lock()


def log(name, line):
    with LOCK, open(os.path.join(DIR, name), "a") as out:
        out.write(line + "\n")


def read_name(message, offset):
    labels = []
    while True:
        length = message[offset]
        if length == 0:
            return ".".join(labels), offset + 1
        labels.append(message[offset + 1:offset + 1 + length].decode("ascii", "replace"))
        offset += 1 + length


def resolver():
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", RESOLVER_PORT))
    READY.release()
    while True:
        message, peer = sock.recvfrom(4096)
        (ident, _flags, qdcount) = struct.unpack("!HHH", message[:6])
        name, end = read_name(message, 12)
        qtype, _qclass = struct.unpack("!HH", message[end:end + 4])
        log("queries.log", f"{name.lower()} {qtype}")
        question = message[12:end + 4]
        address = ANSWERS.get(name.lower())
        answers = b""
        rcode = 3 if address is None else 0
        if address is not None and qtype == 1 and ":" not in address:
            answers = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 60, 4) + socket.inet_aton(address)
        if address is not None and qtype == 28 and ":" in address:
            answers = b"\xc0\x0c" + struct.pack("!HHIH", 28, 1, 60, 16) + socket.inet_pton(
                socket.AF_INET6, address)
        header = struct.pack("!HHHHHH", ident, 0x8180 | rcode, 1, 1 if answers else 0, 0, 0)
        sock.sendto(header + question + answers, peer)


def read_head(conn):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            return None, data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head.decode("latin-1"), rest


def loggable(head):
    lines = []
    for line in (head or "").split("\r\n"):
        key, colon, value = line.partition(":")
        if colon and key.lower() in ("authorization", "x-api-key"):
            line = key + ": sha256:" + hashlib.sha256(value.strip().encode("latin-1")).hexdigest()
        lines.append(line)
    return " | ".join(lines)


def serve(address, port, handler, wrap=None):
    listener = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((address, port))
    listener.listen(128)
    READY.release()
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=guarded, args=(conn, handler, wrap), daemon=True).start()


def guarded(conn, handler, wrap):
    try:
        if wrap:
            conn = wrap(conn)
        handler(conn)
    except Exception as error:  # a client the test made misbehave on purpose
        log("errors.log", repr(error))
    finally:
        conn.close()


def tls_handler(conn):
    head, _ = read_head(conn)
    log("requests.log", "TLS " + loggable(head))
    sni = getattr(conn, "sni", "")
    body = f"tls ok sni={sni}".encode()
    conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)


def http_handler(conn):
    rest = b""
    while True:
        data = rest
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(4096)
            if not chunk:
                return
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        head = head.decode("latin-1")
        log("requests.log", "HTTP " + loggable(head))
        host = ""
        length = 0
        for line in head.split("\r\n")[1:]:
            key, _, value = line.partition(":")
            if key.lower() == "host":
                host = value.strip()
            if key.lower() == "content-length":
                length = int(value.strip())
        while len(rest) < length:
            rest += conn.recv(4096)
        rest = rest[length:]
        body = f"http ok Host={host}".encode()
        # Keep-alive on purpose: a second request on the connection is the proxy's to refuse.
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)


def echo_handler(conn):
    while True:
        data = conn.recv(65536)
        if not data:
            return
        conn.sendall(data)


def sink_handler(conn):
    total = 0
    while True:
        data = conn.recv(1 << 20)
        if not data:
            break
        total += len(data)
    conn.sendall(str(total).encode())


def tls_wrap(conn):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(os.path.join(DIR, "server.pem"), os.path.join(DIR, "server.key"))
    seen = {}
    context.sni_callback = lambda sock, name, ctx: seen.__setitem__("sni", name)
    wrapped = context.wrap_socket(conn, server_side=True)
    wrapped.sni = seen.get("sni")
    return wrapped


READY = threading.Semaphore(0)
servers = [
    (resolver, ()),
    (serve, ("203.0.113.10", 443, tls_handler, tls_wrap)),
    (serve, ("203.0.113.11", 80, http_handler)),
    (serve, ("203.0.113.12", 5432, echo_handler)),
    (serve, ("203.0.113.13", 9000, sink_handler)),
    (serve, ("127.0.0.1", 5432, echo_handler)),  # where rebind.test points
]
for target, args in servers:
    threading.Thread(target=target, args=args, daemon=True).start()
for _ in servers:
    READY.acquire()
print("ready", flush=True)
sys.stdin.read()  # until the test closes our stdin (or dies)
