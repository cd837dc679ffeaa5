#!/usr/bin/env python3
"""HTTP server for the HTTP client and LM handler tests, on 127.0.0.1 (a free port) and on a
unix socket. Prints {"port": N} on stdout once both listen; exits when stdin reaches EOF, so it
never outlives the test that started it.

Paths:
  /status/NNN           answers NNN with an OpenAI-style {"error": {"message"}} body
  /stream               an endless body, until the client goes away
  /slow/SECONDS         sleeps, then echoes
  /v1/chat/completions  a chat completion whose content is the echo (below) as JSON text
  /v1/no-choices        a 200 chat completion without choices
  anything else         echoes {"method", "path", "headers" (lower-cased), "body"} as JSON
"""
import http.server
import json
import socketserver
import sys
import threading
import time


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass  # quiet; and a unix socket peer has no address to log

    def received(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode("utf-8", "replace")
        headers = {name.lower(): value for name, value in self.headers.items()}
        return {"method": self.command, "path": self.path, "headers": headers, "body": body}

    def answer(self, status, document):
        data = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Test-Server", "echo")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def handle_any(self):
        received = self.received()
        path = self.path
        if path.startswith("/status/"):
            status = int(path[len("/status/"):])
            self.answer(status, {"error": {"message": f"the test server answers {status}"}})
        elif path == "/stream":
            self.send_response(200)
            self.end_headers()
            chunk = b"x" * 65536
            try:
                while True:
                    self.wfile.write(chunk)
            except (BrokenPipeError, ConnectionResetError):
                pass
        elif path.startswith("/slow/"):
            time.sleep(float(path[len("/slow/"):]))
            self.answer(200, received)
        elif path == "/v1/chat/completions":
            message = {"role": "assistant", "content": json.dumps(received)}
            self.answer(200, {"object": "chat.completion",
                              "choices": [{"index": 0, "message": message,
                                           "finish_reason": "stop"}]})
        elif path == "/v1/no-choices":
            self.answer(200, {"object": "chat.completion", "choices": []})
        else:
            self.answer(200, received)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = handle_any


class TcpServer(http.server.ThreadingHTTPServer):
    request_queue_size = 64  # the default 5 drops concurrent connects, and they retry after 1 s


class UnixServer(socketserver.ThreadingUnixStreamServer):
    request_queue_size = 64
    daemon_threads = True


def main():
    tcp = TcpServer(("127.0.0.1", 0), Handler)
    unix = UnixServer(sys.argv[1], Handler)
    for server in (tcp, unix):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    print(json.dumps({"port": tcp.server_address[1]}), flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
