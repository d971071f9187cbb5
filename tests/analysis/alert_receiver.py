"""A real HTTP receiver on loopback that records every POST (path, JSON body); can fail the first N posts."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Recorder:
    """What the receiver got, in order; `fail_first` posts are answered 503 (and still recorded as failed)."""

    def __init__(self, fail_first: int = 0) -> None:
        self.posts: list[tuple[str, Any]] = []
        self.failed: list[tuple[str, Any]] = []
        self.fail_first = fail_first
        self.lock = threading.Lock()
        self.port = 0

    def url(self, path: str = "") -> str:
        """Base URL (plus a path)."""
        return f"http://127.0.0.1:{self.port}{path}"

    def on(self, path: str) -> list[Any]:
        """Bodies posted to a path."""
        with self.lock:
            return [body for p, body in self.posts if p == path]


@contextmanager
def recording(fail_first: int = 0) -> Iterator[Recorder]:
    """Serve a Recorder on 127.0.0.1:<free port> for the duration."""
    rec = Recorder(fail_first)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"null")
            with rec.lock:
                fail = rec.fail_first > 0
                if fail:
                    rec.fail_first -= 1
                    rec.failed.append((self.path, body))
                else:
                    rec.posts.append((self.path, body))
            self.send_response(503 if fail else 200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    rec.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield rec
    finally:
        server.shutdown()
        server.server_close()
