"""OTLP/HTTP front end: `POST /v1/traces` on a small asyncio HTTP/1.1 server with keep-alive.

Answers follow the OTLP specification: 200 with an ExportTraceServiceResponse in the
request's encoding (partial_success when spans were rejected); 400 with a google.rpc.Status
naming what was malformed; 401 without the bearer token; 413 over the body cap (checked
after decompression); 415 for other content types or encodings; 503 with Retry-After
when the write queue is full or the receiver is stopping.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from concurrent.futures import Future
from dataclasses import dataclass

from intake.collect.commit import Closed, CommitResult, QueueFull
from intake.collect.decode import (
    ENCODINGS,
    JSON,
    BadEncoding,
    Decoded,
    TooLarge,
    decompress,
    media_type,
    status_body,
    success_body,
)
from intake.collect.intake import Busy, Intake
from intake.peer import peer_host

_log = logging.getLogger(__name__)

PATH = "/v1/traces"
_MAX_LINE = 64 * 1024
_MAX_HEADERS = 100
_IDLE_TIMEOUT_S = 300.0
#: Bodies above this many bytes are decoded on a worker thread, so the loop keeps reading others.
_INLINE_DECODE_BYTES = 4 << 20
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
            411: "Length Required", 413: "Content Too Large", 415: "Unsupported Media Type",
            431: "Request Header Fields Too Large", 500: "Internal Server Error", 503: "Service Unavailable"}


class _HttpError(Exception):
    def __init__(self, status: int, message: str, *, close: bool = False, retry_after: int | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.close = close
        self.retry_after = retry_after


@dataclass
class _Request:
    method: str
    target: str
    headers: dict[str, str]
    keep_alive: bool
    peer: str | None = None  # the client's IP address (recorded as resource tailscope.peer)


class HttpServer:
    """The asyncio server; `start()` binds, `drain()` stops accepting and waits for in-flight requests."""

    def __init__(self, intake: Intake, host: str, port: int) -> None:
        self.intake = intake
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None
        self._inflight = 0
        self._idle_writers: set[asyncio.StreamWriter] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._drained: asyncio.Event | None = None

    async def start(self) -> int:
        """Bind and start accepting; return the bound port."""
        self._drained = asyncio.Event()
        self._drained.set()
        self._server = await asyncio.start_server(self._connection, self.host, self.port, limit=_MAX_LINE,
                                                  reuse_address=True, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def drain(self, timeout: float) -> None:
        """Stop accepting, answer every request already started, then close idle connections."""
        if self._server is not None:
            self._server.close()
        if self._drained is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._drained.wait(), timeout)
        for writer in list(self._writers):
            writer.close()
        if self._server is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    # --- one connection ------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                try:
                    line = await asyncio.wait_for(reader.readline(), _IDLE_TIMEOUT_S)
                except (TimeoutError, ConnectionError):
                    return
                except (asyncio.LimitOverrunError, ValueError):
                    await self._send(writer, 431, status_body(431, "request line too long", JSON), JSON,
                                     close=True)
                    return
                if not line:
                    return
                if not line.strip():
                    continue  # tolerate stray CRLF between requests
                self._begin()
                try:
                    keep = await self._request(line, reader, writer, refuse=self.intake.draining)
                finally:
                    self._end()
                if not keep or self.intake.draining:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _begin(self) -> None:
        self._inflight += 1
        if self._drained is not None:
            self._drained.clear()

    def _end(self) -> None:
        self._inflight -= 1
        if self._inflight == 0 and self._drained is not None:
            self._drained.set()

    async def _read_head(self, line: bytes, reader: asyncio.StreamReader) -> _Request:
        try:
            method, target, version = line.decode("latin-1").split()
        except ValueError:
            raise _HttpError(400, "malformed HTTP request line", close=True) from None
        headers: dict[str, str] = {}
        for _ in range(_MAX_HEADERS + 1):
            try:
                raw = await reader.readline()
            except (asyncio.LimitOverrunError, ValueError):
                raise _HttpError(431, "header line too long", close=True) from None
            if raw in (b"\r\n", b"\n", b""):
                break
            name, sep, value = raw.decode("latin-1").partition(":")
            if not sep:
                raise _HttpError(400, f"malformed header line {raw[:60]!r}", close=True)
            headers[name.strip().lower()] = value.strip()
        else:
            raise _HttpError(431, f"more than {_MAX_HEADERS} headers", close=True)
        conn = headers.get("connection", "").lower()
        keep_alive = "close" not in conn if version == "HTTP/1.1" else "keep-alive" in conn
        return _Request(method.upper(), target, headers, keep_alive)

    async def _read_body(self, req: _Request, reader: asyncio.StreamReader, cap: int) -> bytes:
        if "chunked" in req.headers.get("transfer-encoding", "").lower():
            return await self._read_chunked(reader, cap)
        length_text = req.headers.get("content-length")
        if length_text is None:
            raise _HttpError(411, "Content-Length (or chunked Transfer-Encoding) is required", close=True)
        try:
            length = int(length_text)
            if length < 0:
                raise ValueError
        except ValueError:
            raise _HttpError(400, f"bad Content-Length {length_text!r}", close=True) from None
        if length > cap:
            # read and drop a moderately oversized body so the client sees the 413, not a reset
            if length <= 2 * cap:
                await reader.readexactly(length)
                raise _HttpError(413, f"body of {length:,} bytes is over the {cap:,}-byte limit")
            raise _HttpError(413, f"body of {length:,} bytes is over the {cap:,}-byte limit", close=True)
        return await reader.readexactly(length)

    async def _read_chunked(self, reader: asyncio.StreamReader, cap: int) -> bytes:
        parts: list[bytes] = []
        total = 0
        while True:
            size_line = await reader.readline()
            try:
                size = int(size_line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise _HttpError(400, "malformed chunk size line", close=True) from None
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(parts)
            total += size
            if total > cap:
                raise _HttpError(413, f"chunked body is over the {cap:,}-byte limit", close=True)
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)

    async def _request(self, line: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                       refuse: bool) -> bool:
        encoding = JSON
        try:
            req = await self._read_head(line, reader)
            req.peer = peer_host(writer.get_extra_info("peername"))
            if req.headers.get("expect", "").lower() == "100-continue":
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            return await self._handle(req, reader, writer, refuse=refuse)
        except _HttpError as exc:
            if exc.status >= 500:
                self.intake.refused()
            else:
                self.intake.bad()
            await self._send(writer, exc.status, status_body(exc.status, exc.message, encoding), encoding,
                             close=exc.close, retry_after=exc.retry_after)
            return not exc.close
        except (ConnectionError, asyncio.IncompleteReadError):
            raise
        except Exception as exc:  # a bug must answer (500, retried by exporters), not drop the connection
            _log.exception("request failed")
            self.intake.refused()
            await self._send(writer, 500, status_body(500, f"internal error: {exc!r}", encoding), encoding,
                             close=True)
            return False

    async def _handle(self, req: _Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                      refuse: bool) -> bool:
        intake = self.intake
        cap = intake.config.max_body_bytes
        path = req.target.split("?", 1)[0]
        encoding = media_type(req.headers.get("content-type"))
        answer_in = encoding if encoding in ENCODINGS else JSON
        try:
            if path != PATH:
                raise _HttpError(404, f"no such endpoint {path!r}; OTLP traces go to POST {PATH}", close=True)
            if req.method != "POST":
                raise _HttpError(405, f"{req.method} is not allowed; OTLP traces are sent with POST {PATH}",
                                 close=True)
            if not intake.authorized(req.headers.get("authorization")):
                await self._read_body(req, reader, cap)
                raise _HttpError(401, "missing or wrong bearer token: send 'Authorization: Bearer <token>'")
            body = await self._read_body(req, reader, cap)
            if encoding not in ENCODINGS:
                raise _HttpError(415, f"Content-Type must be application/x-protobuf or application/json, "
                                      f"got {req.headers.get('content-type', '(none)')!r}")
            if refuse:  # the request began after shutdown started; one begun before is still answered
                raise _HttpError(503, "the receiver is shutting down; retry", retry_after=intake.config.retry_after_s,
                                 close=True)
            try:
                intake.reserve(len(body))
            except Busy as exc:
                raise _HttpError(503, str(exc), retry_after=intake.config.retry_after_s) from None
            try:
                payload = await self._decode_and_queue(body, req, encoding)
            finally:
                intake.release(len(body))
        except _HttpError as exc:
            if exc.status >= 500:
                intake.refused()
            else:
                intake.bad()
            await self._send(writer, exc.status, status_body(exc.status, exc.message, answer_in), answer_in,
                             close=exc.close or not req.keep_alive, retry_after=exc.retry_after)
            return req.keep_alive and not exc.close
        await self._send(writer, 200, payload, encoding, close=not req.keep_alive)
        return req.keep_alive

    async def _decode_and_queue(self, body: bytes, req: _Request, encoding: str) -> bytes:
        intake = self.intake
        retry = intake.config.retry_after_s
        try:
            if len(body) > _INLINE_DECODE_BYTES or req.headers.get("content-encoding"):
                loop = asyncio.get_running_loop()
                decoded, future = await loop.run_in_executor(None, self._accept, body, req, encoding)
            else:
                decoded, future = self._accept(body, req, encoding)
        except TooLarge as exc:
            raise _HttpError(413, str(exc)) from None
        except BadEncoding as exc:
            raise _HttpError(415, str(exc)) from None
        except ValueError as exc:
            raise _HttpError(400, str(exc)) from None
        except (QueueFull, Closed) as exc:
            raise _HttpError(503, f"{exc}; retry after {retry} s", retry_after=retry) from None
        if future is not None:
            try:
                await asyncio.wrap_future(future)
            except Exception as exc:
                raise _HttpError(503, f"could not store the spans ({exc}); retry", retry_after=retry) from None
        return success_body(decoded.result, encoding)

    def _accept(self, body: bytes, req: _Request, encoding: str) -> tuple[Decoded, Future[CommitResult] | None]:
        data = decompress(body, req.headers.get("content-encoding"), self.intake.config.max_body_bytes)
        return self.intake.accept(data, encoding, peer=req.peer)

    async def _send(self, writer: asyncio.StreamWriter, status: int, body: bytes, content_type: str, *,
                    close: bool = False, retry_after: int | None = None) -> None:
        head = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}",
                f"Content-Type: {content_type}", f"Content-Length: {len(body)}"]
        if retry_after is not None:
            head.append(f"Retry-After: {retry_after}")
        if close:
            head.append("Connection: close")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
