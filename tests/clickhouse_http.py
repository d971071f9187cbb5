"""ClickHouse's HTTP interface in front of chdb, for tests: `python tests/clickhouse_http.py --path DIR`.

It serves the part of the interface clickhouse-connect (our `clickhouse://` client) uses, with
the ClickHouse release of whichever chdb the running Python has, so one test run drives several
releases from one client (one venv holds one chdb; `make test` builds .venv-ch/<release>):

- a query in the URL's `query` parameter and/or the POST body; with both, the body is an
  INSERT's data (`INSERT INTO t [(cols)] FORMAT fmt`, read through chdb's `file()`);
- every URL parameter that is not a transport one is a setting of that query: applied with
  `SET` before it and set back after (`readonly` rides on the query's SETTINGS clause, as it
  cannot be set back); an unknown one fails as the server fails it (Code 115);
- `database` (each request runs in it: Code 81 when it does not exist), user and password
  (Basic auth, the X-ClickHouse-User / -Key headers or URL parameters; Code 516 when refused);
- the output format named by the query's FORMAT clause (else `default_format`, else
  TabSeparated), produced by chdb itself: Native, Arrow, ArrowStream, RowBinary, ...;
- compression: request bodies in gzip, deflate, lz4 (frame) or zstd (Content-Encoding), and
  answers compressed with the first of those the client accepts when it asks for
  `enable_http_compression=1`;
- errors as the server sends them: HTTP 4xx / 500, the body `Code: N. DB::Exception: ...
  (version X)` and the `X-ClickHouse-Exception-Code` header.

Differences from a server, none of which our client relies on: one chdb session serves every
request in turn (temporary tables are shared between HTTP sessions; requests queue); a query
parameter (`param_x`) is refused; the `readonly` of a query that has a SETTINGS clause of its own
is appended to that clause. One test-only setting: `tailscope_test_cut=1` sends the headers and
half the answer, then closes the connection (a server dying mid-answer).

With CH_HTTP_DEBUG=1 in its environment it prints each statement the engine refused to stderr.

This file runs in a venv holding only chdb (and lz4 / zstandard when the client compresses with
them): it imports nothing of tailscope. It prints the port it listens on (127.0.0.1), then serves.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import gzip
import http.server
import json
import os
import re
import sys
import tempfile
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import parse_qsl, urlsplit

#: URL parameters that are not settings of the query.
TRANSPORT = frozenset({
    "query", "database", "session_id", "session_timeout", "session_check", "query_id", "default_format", "compress",
    "decompress", "user", "password", "quota_key", "buffer_size", "wait_end_of_query", "client_protocol_version",
    "enable_http_compression", "send_progress_in_http_headers", "http_headers_progress_interval_ms",
    "http_zlib_compression_level", "role"})
#: The test-only setting that cuts the answer in half.
CUT = "tailscope_test_cut"
#: HTTP status per exception code, as ClickHouse answers them (others: 500).
STATUS = {516: 403, 192: 403, 194: 403, 164: 403, 60: 404, 81: 404, 62: 400, 115: 400, 27: 400, 36: 400}
_FORMAT = re.compile(r"(?is)\s+FORMAT\s+([A-Za-z0-9_]+)\s*;?\s*$")
_INSERT = re.compile(r"(?is)^\s*INSERT\s+INTO\s+(?:TABLE\s+)?(?P<table>[`\w.]+)\s*(?P<cols>\([^)]*\))?\s*"
                     r"(?:SETTINGS\s+(?P<settings>.*?)\s*)?FORMAT\s+(?P<fmt>\w+)\s*$")
_READS = re.compile(r"(?is)^\s*(\(\s*)*(SELECT|WITH|SHOW|DESCRIBE|DESC|EXISTS|EXPLAIN)\b")
_SET = re.compile(r"(?is)^\s*SET\b")
_SETTINGS_TAIL = re.compile(r"(?is)\bSETTINGS\s+[^()']*$")


def _codecs() -> dict[str, tuple[Any, Any]]:
    """Content-Encoding -> (compress, decompress) that this Python has."""
    out: dict[str, tuple[Any, Any]] = {"gzip": (gzip.compress, gzip.decompress),
                                       "deflate": (zlib.compress, zlib.decompress)}
    try:
        import lz4.frame as lz4f
        out["lz4"] = (lz4f.compress, lz4f.decompress)
    except ModuleNotFoundError:
        pass
    try:
        import zstandard
        out["zstd"] = (lambda b: zstandard.ZstdCompressor().compress(b),
                       lambda b: zstandard.ZstdDecompressor().decompressobj().decompress(b))
    except ModuleNotFoundError:
        pass
    return out


class ServerError(Exception):
    """An exception of the engine (or of this front), with its ClickHouse code."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code = code


class Engine:
    """One chdb session behind a lock, with the HTTP interface's per-query settings and database."""

    def __init__(self, path: str, database: str) -> None:
        # every call on one thread: an older chdb starts its engine again when called from another thread
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.s = self.pool.submit(_session, path).result()
        self.version = self.run("SELECT version()").decode().strip()
        self.lock = threading.Lock()
        #: the session's own value of each setting a request has named: what the request's settings are set back to
        #: (read once per name: every request sets back what it changed, so the values stay; a SET sent as a query
        #: forgets them all)
        self.defaults: dict[str, str] = {}
        #: the session's value of each setting a request has named since the defaults were read, and the database it
        #: is in (None: unknown): a request sets only what differs from what it needs (a statement each costs as much
        #: as a small query, and clickhouse-connect names the same five settings in every request)
        self.current: dict[str, str] = {}
        self.database: str | None = None
        if database != "default":  # chdb 2.x keeps `default` read-only (an Overlay): a server has its own database
            self.run(f"CREATE DATABASE IF NOT EXISTS `{database}`")

    def run(self, sql: str, fmt: str = "TabSeparated") -> bytes:
        """One statement; ServerError with the engine's code when it fails."""
        return self.pool.submit(self._run, sql, fmt).result()

    def _run(self, sql: str, fmt: str) -> bytes:
        try:
            res = self.s.query(sql, fmt)
        except Exception as exc:
            text = str(exc).strip()
            m = re.search(r"Code: (\d+)", text)
            if os.environ.get("CH_HTTP_DEBUG"):
                print("FAILED", repr(sql[:200]), "...", repr(sql[-200:]), text[:200], file=sys.stderr, flush=True)
            raise ServerError(int(m.group(1)) if m else 1001, text) from None
        if res is None:
            return b""
        return bytes(res.bytes())

    def serve(self, sql: str, data: bytes | None, settings: dict[str, str], database: str, fmt: str) -> bytes:
        """Run one HTTP request's query under its settings, in its database; the answer's bytes."""
        with self.lock:  # one request at a time: its settings are the session's while it runs
            if database != self.database:
                self.database = None
                self.run(f"USE `{database}`")
                self.database = database
            readonly = settings.pop("readonly", None)
            for k in settings:
                if not re.fullmatch(r"\w+", k):
                    raise ServerError(115, f"Code: 115. DB::Exception: Unknown setting '{k}'. (UNKNOWN_SETTING)")
            unread = [k for k in settings if k not in self.defaults]
            if unread:
                names = ", ".join("'" + k.replace("'", "") + "'" for k in unread)
                for line in self.run(f"SELECT name, value FROM system.settings WHERE name IN ({names})").decode(
                        ).splitlines():
                    k, _, v = line.partition("\t")
                    self.defaults[k] = v
            # what the session must hold: each setting named before back at its default, this request's as it asks
            wanted = {**{k: self.defaults[k] for k in self.current if k not in settings}, **settings}
            try:
                for k, v in wanted.items():
                    if self.current.get(k) != v:
                        self.current.pop(k, None)
                        self.run(f"SET {k} = {_quote(v)}")
                        if k in self.defaults:  # one it cannot set back is set each time, as asked
                            self.current[k] = v
                if readonly not in (None, "0"):
                    sql = _with_setting(sql, f"readonly = {int(readonly)}")
                if data is not None:
                    return self._insert(sql, data)
                return self.run(sql, fmt)
            finally:
                if _SET.match(sql) or re.match(r"(?is)^\s*USE\b", sql):  # the session's own: read again
                    for k in settings:
                        if k in self.defaults:
                            self.run(f"SET {k} = {_quote(self.defaults[k])}")
                    self.defaults.clear()
                    self.current.clear()
                    self.database = None

    def _insert(self, sql: str, data: bytes) -> bytes:
        m = _INSERT.match(sql)
        if m is None:
            raise ServerError(62, "Code: 62. DB::Exception: this front reads INSERT INTO t [(cols)] FORMAT f with "
                                  "data only. (SYNTAX_ERROR)")
        with tempfile.NamedTemporaryFile(prefix="ch-http-", suffix="." + m["fmt"].lower()) as f:
            f.write(data)
            f.flush()
            settings = f" SETTINGS {m['settings']}" if m["settings"] else ""
            self.run(f"INSERT INTO {m['table']} {m['cols'] or ''}{settings} SELECT * FROM file('{f.name}', "
                     f"'{m['fmt']}')")
        return b""


def _session(path: str) -> Any:
    from chdb import session

    return session.Session(path)


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _with_setting(sql: str, setting: str) -> str:
    """`sql` with one more setting on its SETTINGS clause (a new clause when it has none), before its FORMAT."""
    fmt = _FORMAT.search(sql)
    body, tail = (sql[:fmt.start()], sql[fmt.start():]) if fmt else (sql.rstrip().rstrip(";"), "")
    if _SETTINGS_TAIL.search(body):
        return f"{body}, {setting}{tail}"
    return f"{body} SETTINGS {setting}{tail}"


def handler(engine: Engine, user: str, password: str, default_db: str) -> type[http.server.BaseHTTPRequestHandler]:
    """The request handler of a server in front of `engine`."""
    codecs = _codecs()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if url.path in ("/ping", "/") and "query" not in dict(parse_qsl(url.query)):
                return self._send(200, b"Ok.\n", {})
            self._handle(b"")

        def do_POST(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n) if n else b""
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                body = self._chunked()
            self._handle(body)

        def _chunked(self) -> bytes:
            out = b""
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()

        def _send(self, status: int, body: bytes, headers: dict[str, str], cut: bool = False) -> None:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if cut:
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)
                return
            self.wfile.write(body)

        def _fail(self, exc: ServerError) -> None:
            text = exc.args[0]
            if not text.startswith("Code:"):
                text = f"Code: {exc.code}. DB::Exception: {text}"
            body = f"{text} (version {engine.version})\n".encode()
            self._send(STATUS.get(exc.code, 500), body, {"X-ClickHouse-Exception-Code": str(exc.code),
                                                         "Content-Type": "text/plain; charset=UTF-8"})

        def _handle(self, body: bytes) -> None:
            params = dict(parse_qsl(urlsplit(self.path).query, keep_blank_values=True))
            who, key = self._credentials(params)
            if who != user or key != password:
                return self._fail(ServerError(516, f"Code: 516. DB::Exception: {who}: Authentication failed: password "
                                                   "is incorrect, or there is no user with such name. "
                                                   "(AUTHENTICATION_FAILED)"))
            enc = self.headers.get("Content-Encoding")
            if body and enc and enc != "identity":
                if enc not in codecs:
                    return self._fail(ServerError(1001, f"this front cannot read Content-Encoding {enc}"))
                body = codecs[enc][1](body)
            if "query" in params:
                sql, data = params["query"], (body if body else None)
                if data is not None and not re.match(r"(?is)^\s*INSERT\b", sql):
                    sql, data = sql + "\n" + body.decode(), None
            else:
                sql, data = body.decode(), None
            if any(k.startswith("param_") for k in params):
                return self._fail(ServerError(456, "this front takes no query parameters"))
            settings = {k: v for k, v in params.items() if k not in TRANSPORT}
            cut = settings.pop(CUT, "0") == "1"
            fmt_m = _FORMAT.search(sql)
            fmt = fmt_m.group(1) if fmt_m else params.get("default_format", "TabSeparated")
            try:
                out = engine.serve(sql, data, settings, params.get("database") or default_db, fmt)
            except ServerError as exc:
                return self._fail(exc)
            headers = {"Content-Type": "application/octet-stream", "X-ClickHouse-Format": fmt,
                       "X-ClickHouse-Timezone": "UTC", "X-ClickHouse-Server-Display-Name": "chdb",
                       "X-ClickHouse-Query-Id": params.get("query_id", ""),
                       "X-ClickHouse-Summary": json.dumps({"read_rows": "0", "read_bytes": "0",
                                                           "written_rows": "0", "written_bytes": "0"})}
            if params.get("enable_http_compression") == "1":
                for want in (e.strip() for e in self.headers.get("Accept-Encoding", "").split(",")):
                    if want in codecs:
                        out = codecs[want][0](out)
                        headers["Content-Encoding"] = want
                        break
            self._send(200, out, headers, cut=cut)

        def _credentials(self, params: dict[str, str]) -> tuple[str, str]:
            auth = self.headers.get("Authorization", "")
            if auth.startswith("Basic "):
                who, _, key = base64.b64decode(auth[6:]).decode().partition(":")
                return who, key
            if self.headers.get("X-ClickHouse-User"):
                return self.headers["X-ClickHouse-User"], self.headers.get("X-ClickHouse-Key", "")
            return params.get("user", "default"), params.get("password", "")

    return Handler


def main(argv: list[str] | None = None) -> None:
    """Serve until killed; the first line on stdout is the port."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", required=True, help="chdb's data directory")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--database", default="default", help="created when missing; the default of requests")
    ap.add_argument("--user", default="default")
    ap.add_argument("--password", default="")
    a = ap.parse_args(argv)
    engine = Engine(os.path.abspath(a.path), a.database)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", a.port), handler(engine, a.user, a.password, a.database))
    server.daemon_threads = True
    print(server.server_address[1], engine.version, flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()


if __name__ == "__main__":
    main()
