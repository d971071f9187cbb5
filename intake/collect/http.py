"""OTLP/HTTP front end: `POST /v1/traces` over HTTP/1.1 with keep-alive, parsed by h11.

h11 (a well-kept, pure HTTP/1.1 state machine) does the framing: request line, headers,
Content-Length and chunked bodies, keep-alive. This module decides, in this order and
before a single byte of body is read: endpoint and method, bearer token, Content-Length
against the body cap, and a reservation of the body's bytes in the global in-flight
budget; only then is `100 Continue` sent and the body read. Every read has a deadline
(idle between requests, whole header block, body progress and whole body), the number of
connections is capped, and a refused request closes its connection without reading the
body, so an unauthenticated or oversized sender costs a few KiB.

Answers follow the OTLP specification: 200 with an ExportTraceServiceResponse in the
request's encoding (partial_success when spans were rejected); 400 with a google.rpc.Status
naming what was malformed; 401 without the bearer token; 413 over the body cap (checked on
Content-Length and again after decompression); 415 for other content types or encodings;
431 for a header block over its limit; 503 with Retry-After when the write queue or the
byte budget is full, or the receiver is stopping.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import h11

from intake.collect.commit import Closed, CommitResult, QueueFull
from intake.collect.config import CollectConfig
from intake.collect.decode import (
    ENCODINGS,
    JSON,
    PROTOBUF,
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
#: Bytes read from the socket at a time.
_READ_BYTES = 256 * 1024
#: a connection counts as sending (for the journal) this long after its last accepted body, in seconds
SENDER_WINDOW_S = 1.0
#: Bodies above this many bytes are decoded on a worker thread, so the loop keeps reading others.
_INLINE_DECODE_BYTES = 4 << 20
#: Protobuf bodies from this many bytes go to a worker thread when the C extractor takes them: it runs
#: without the GIL, so the loop answers and reads other connections meanwhile instead of waiting ~2 us a
#: span; with 8 clients of 512-span bodies, ~20 % less receiver CPU per span and ~30 % more spans/s in an
#: A/B run (docs/benchmarks.md). Smaller bodies stay inline: the hand-off to a thread would
#: cost more than their extraction.
_OFFLOAD_PROTOBUF_BYTES = 8 << 10
#: Seconds a connection closed on an early answer keeps draining (and dropping) its input.
LINGER_S = 2.0
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
            408: "Request Timeout", 411: "Length Required", 413: "Content Too Large",
            415: "Unsupported Media Type", 431: "Request Header Fields Too Large", 500: "Internal Server Error",
            503: "Service Unavailable"}


class _HttpError(Exception):
    def __init__(self, status: int, message: str, *, close: bool = False, retry_after: int | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.close = close
        self.retry_after = retry_after


class _Gone(Exception):
    """The peer closed, or went silent past a deadline: drop the connection without answering."""


@dataclass
class _Request:
    method: str
    target: str
    headers: dict[str, str]
    peer: str | None = None  # the client's IP address (recorded as resource tailscope.peer when asked)


class _Conn:
    """One client connection: the socket streams, the h11 state machine and the read deadlines."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, config: CollectConfig) -> None:
        self.reader = reader
        self.writer = writer
        self.config = config
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=config.max_header_bytes)
        #: an answer went out before the request was read whole: close gently (see `linger`)
        self.unread = False

    async def _feed(self, timeout: float) -> None:
        if timeout <= 0:
            raise TimeoutError
        # asyncio.timeout, not wait_for: wait_for wraps the read in a task of its own (~37 against ~9 us a call,
        # and this runs a few times per request: ~0.3 us of receiver CPU a span with 512-span bodies)
        async with asyncio.timeout(timeout):
            data = await self.reader.read(_READ_BYTES)
        self.h11.receive_data(data)  # b"" tells h11 the peer closed

    async def head(self) -> h11.Request | None:
        """The next request's head; None when the peer closed or idled out between requests.

        Idle time before the first byte is bounded by idle_timeout_s; from the first byte, the
        whole header block must arrive within header_timeout_s (a slow-loris sender is dropped).
        """
        started: float | None = time.monotonic() if self.h11.trailing_data[0] else None
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                if started is None:
                    try:
                        await self._feed(self.config.idle_timeout_s)
                    except TimeoutError:
                        return None
                    started = time.monotonic()
                else:
                    try:
                        await self._feed(started + self.config.header_timeout_s - time.monotonic())
                    except TimeoutError:
                        raise _HttpError(408, f"request header not complete within "
                                              f"{self.config.header_timeout_s:g} s", close=True) from None
                continue
            if isinstance(event, h11.Request):
                return event
            if isinstance(event, h11.ConnectionClosed):
                return None
            raise _HttpError(400, f"unexpected {type(event).__name__} before a request", close=True)

    async def body(self, cap: int, on_bytes: _Reserve) -> bytes:
        """The request body, read with a progress deadline (read_timeout_s between reads) and a
        whole-body deadline (body_timeout_s); 413 past `cap`; `on_bytes` claims chunked growth."""
        parts: list[bytes] = []
        total = 0
        deadline = time.monotonic() + self.config.body_timeout_s
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                left = deadline - time.monotonic()
                try:
                    await self._feed(min(self.config.read_timeout_s, left))
                except TimeoutError:
                    what = (f"no body bytes for {self.config.read_timeout_s:g} s"
                            if left > self.config.read_timeout_s else
                            f"body not complete within {self.config.body_timeout_s:g} s")
                    raise _HttpError(408, what, close=True) from None
                continue
            if isinstance(event, h11.Data):
                total += len(event.data)
                if total > cap:
                    raise _HttpError(413, f"body is over the {cap:,}-byte limit", close=True)
                on_bytes.grow(total)
                parts.append(bytes(event.data))
                continue
            if isinstance(event, h11.EndOfMessage):
                return parts[0] if len(parts) == 1 else b"".join(parts)
            if isinstance(event, h11.ConnectionClosed):
                raise _Gone
            raise _HttpError(400, f"unexpected {type(event).__name__} in the body", close=True)

    async def send(self, status: int, body: bytes, content_type: str, *, close: bool,
                   retry_after: int | None = None) -> None:
        headers = [("content-type", content_type), ("content-length", str(len(body)))]
        if retry_after is not None:
            headers.append(("retry-after", str(retry_after)))
        if close:
            headers.append(("connection", "close"))
        try:
            data = self.h11.send(h11.Response(status_code=status, headers=headers,
                                              reason=_REASONS.get(status, "Error")))
            data = (data or b"") + (self.h11.send(h11.Data(data=body)) or b"") + (
                self.h11.send(h11.EndOfMessage()) or b"")
        except h11.LocalProtocolError:  # h11 is in an error state: answer in plain bytes and close
            data = raw_response(status, body, content_type, retry_after)
        await self.write(data)

    async def write(self, data: bytes) -> None:
        self.writer.write(data)
        try:
            async with asyncio.timeout(self.config.read_timeout_s):  # see _feed
                await self.writer.drain()
        except (TimeoutError, ConnectionError):
            raise _Gone from None

    async def linger(self) -> None:
        """Half-close, then read and drop what the client still sends for up to LINGER_S.

        Closing a socket with unread input makes the kernel send a reset, which can destroy the
        answer (401, 413, 503) before the client reads it; draining for a bounded time keeps
        the answer deliverable and costs no memory (the bytes are dropped as they arrive).
        """
        with contextlib.suppress(Exception):
            if self.writer.can_write_eof():
                self.writer.write_eof()
            deadline = time.monotonic() + LINGER_S
            while (left := deadline - time.monotonic()) > 0:
                if not await asyncio.wait_for(self.reader.read(_READ_BYTES), left):
                    return

    def reusable(self) -> bool:
        """True when both sides finished the request cleanly and the connection can carry another."""
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
            return True
        return False


def raw_response(status: int, body: bytes, content_type: str, retry_after: int | None = None) -> bytes:
    """A complete `Connection: close` response in bytes, for answers outside the h11 state machine."""
    head = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}", f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}", "Connection: close"]
    if retry_after is not None:
        head.append(f"Retry-After: {retry_after}")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


class _Reserve:
    """The bytes one request holds in the intake's in-flight budget (grows with a chunked body)."""

    def __init__(self, intake: Intake) -> None:
        self.intake = intake
        self.held = 0

    def grow(self, total: int) -> None:
        if total > self.held:
            try:
                self.intake.reserve(total - self.held)
            except Busy as exc:
                raise _HttpError(503, str(exc), close=True,
                                 retry_after=self.intake.config.retry_after_s) from None
            self.held = total

    def release(self) -> None:
        if self.held:
            self.intake.release(self.held)
            self.held = 0


class HttpServer:
    """The asyncio server; `start()` binds, `drain()` stops accepting and waits for in-flight requests."""

    def __init__(self, intake: Intake, host: str, port: int) -> None:
        self.intake = intake
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None
        self._inflight = 0
        self.connections = 0
        # connection -> when it last had a body accepted (the HTTP thread writes it): how many clients are
        # sending now, which decides whether requests are answered from the journal (intake/collect/journal.py)
        self._recent: dict[int, float] = {}
        self._delivered = 0  # requests whose whole body was read and that are not answered yet
        self._pruned = 0.0
        self._writers: set[asyncio.StreamWriter] = set()
        self._drained: asyncio.Event | None = None
        # one thread for the C extraction of protobuf bodies (see _OFFLOAD_PROTOBUF_BYTES): the builder takes
        # one body at a time anyway, and every further thread would bring its own malloc arena (RSS)
        self._extractor = ThreadPoolExecutor(1, thread_name_prefix="tailscope-extract")

    def others_sending(self, conn: object) -> bool:
        """True when another connection had a body accepted in about the last second, or has a whole body
        being decoded or stored now (connections that only idle, stall or send what is refused do not count).
        The second part counts clients that start together: their first bodies are journalled too, instead
        of each waiting for a segment (the start of a run)."""
        return self._delivered > 0 or len(self._recent) - (id(conn) in self._recent) > 0

    def _accepted(self, conn: object) -> None:
        now = time.monotonic()
        self._recent[id(conn)] = now
        if now - self._pruned > 0.25:
            self._pruned = now
            for key in [k for k, t in self._recent.items() if now - t > SENDER_WINDOW_S]:
                del self._recent[key]

    async def start(self) -> int:
        """Bind and start accepting; return the bound port."""
        self._drained = asyncio.Event()
        self._drained.set()
        self._server = await asyncio.start_server(self._connection, self.host, self.port,
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
        self._extractor.shutdown(wait=False)

    # --- one connection ------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        config = self.intake.config
        if self.connections >= config.max_connections:
            self.intake.refused()
            writer.write(raw_response(503, status_body(503, f"more than {config.max_connections} connections; "
                                                            "retry", JSON), JSON, config.retry_after_s))
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.drain(), 1)
            writer.close()
            return
        self.connections += 1
        self._writers.add(writer)
        conn = _Conn(reader, writer, config)
        try:
            while True:
                try:
                    head = await conn.head()
                except _HttpError as exc:
                    self.intake.bad()
                    conn.unread = True
                    await conn.write(raw_response(exc.status, status_body(exc.status, exc.message, JSON), JSON))
                    return
                except h11.RemoteProtocolError as exc:
                    self.intake.bad()
                    conn.unread = True
                    status = exc.error_status_hint if exc.error_status_hint in _REASONS else 400
                    what = (f"request header block is over the {config.max_header_bytes:,}-byte limit"
                            if status == 431 else f"malformed HTTP request ({exc})")
                    await conn.write(raw_response(status, status_body(status, what, JSON), JSON))
                    return
                if head is None:
                    return
                self._begin()
                try:
                    keep = await self._request(conn, head, refuse=self.intake.draining)
                finally:
                    self._end()
                if not keep or self.intake.draining or not conn.reusable():
                    return
        except (_Gone, ConnectionError, TimeoutError):
            return
        finally:
            if conn.unread and not self.intake.draining:
                await conn.linger()
            self.connections -= 1
            self._recent.pop(id(conn), None)
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1)

    def _begin(self) -> None:
        self._inflight += 1
        if self._drained is not None:
            self._drained.clear()

    def _end(self) -> None:
        self._inflight -= 1
        if self._inflight == 0 and self._drained is not None:
            self._drained.set()

    async def _request(self, conn: _Conn, head: h11.Request, *, refuse: bool) -> bool:
        """Answer one request; True when the connection may carry another."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in head.headers}
        req = _Request(head.method.decode("latin-1").upper(), head.target.decode("latin-1"), headers,
                       peer_host(conn.writer.get_extra_info("peername")))
        encoding = media_type(headers.get("content-type"))
        answer_in = encoding if encoding in ENCODINGS else JSON
        reserve = _Reserve(self.intake)
        try:
            try:
                payload = await self._handle(conn, req, encoding, reserve, refuse=refuse)
            finally:
                reserve.release()
        except _HttpError as exc:
            if exc.status >= 500:
                self.intake.refused()
            else:
                self.intake.bad()
            # a request answered before its body was read closes the connection: the unread body
            # must not be taken for the next request
            close = exc.close or conn.h11.their_state is not h11.DONE
            conn.unread = close
            await conn.send(exc.status, status_body(exc.status, exc.message, answer_in), answer_in,
                            close=close, retry_after=exc.retry_after)
            return not close
        except h11.RemoteProtocolError as exc:
            self.intake.bad()
            await conn.write(raw_response(400, status_body(400, f"malformed HTTP request ({exc})", answer_in),
                                          answer_in))
            return False
        except (_Gone, ConnectionError, asyncio.CancelledError):
            raise
        except Exception as exc:  # a bug must answer (500, retried by exporters), not drop the connection
            _log.exception("request failed")
            self.intake.refused()
            await conn.write(raw_response(500, status_body(500, f"internal error: {exc!r}", answer_in), answer_in))
            return False
        await conn.send(200, payload, encoding, close=False)
        return True

    async def _handle(self, conn: _Conn, req: _Request, encoding: str, reserve: _Reserve, *,
                      refuse: bool) -> bytes:
        intake = self.intake
        config = intake.config
        cap = config.max_body_bytes
        path = req.target.split("?", 1)[0]
        if path != PATH:
            raise _HttpError(404, f"no such endpoint {path!r}; OTLP traces go to POST {PATH}", close=True)
        if req.method != "POST":
            raise _HttpError(405, f"{req.method} is not allowed; OTLP traces are sent with POST {PATH}", close=True)
        if not intake.authorized(req.headers.get("authorization")):
            raise _HttpError(401, "missing or wrong bearer token: send 'Authorization: Bearer <token>'", close=True)
        if encoding not in ENCODINGS:
            raise _HttpError(415, f"Content-Type must be application/x-protobuf or application/json, "
                                  f"got {req.headers.get('content-type', '(none)')!r}", close=True)
        if refuse:  # the request began after shutdown started; one begun before is still answered
            raise _HttpError(503, "the receiver is shutting down; retry", retry_after=config.retry_after_s,
                             close=True)
        length_text = req.headers.get("content-length")
        if length_text is not None:
            length = int(length_text)  # h11 has checked it is a decimal number
            if length > cap:
                raise _HttpError(413, f"body of {length:,} bytes is over the {cap:,}-byte limit", close=True)
            reserve.grow(length)  # the whole body is claimed before it is read: 503 when the budget is full
        elif "chunked" not in req.headers.get("transfer-encoding", "").lower():
            raise _HttpError(411, "Content-Length (or chunked Transfer-Encoding) is required", close=True)
        if conn.h11.they_are_waiting_for_100_continue:
            await conn.write(conn.h11.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
        body = await conn.body(cap, reserve)
        several = self.others_sending(conn)
        self._delivered += 1
        try:
            decoded, future = await self._decode_and_queue(body, req, encoding, reserve, several)
            self._accepted(conn)
            retry = config.retry_after_s
            if future is not None:
                try:
                    await asyncio.wrap_future(future)
                except Exception as exc:
                    raise _HttpError(503, f"could not store the spans ({exc}); retry", retry_after=retry) from None
        finally:
            self._delivered -= 1
        return success_body(decoded.result, encoding)

    async def _decode_and_queue(self, body: bytes, req: _Request, encoding: str, reserve: _Reserve,
                                several: bool) -> tuple[Decoded, Future[CommitResult] | None]:
        retry = self.intake.config.retry_after_s
        try:
            loop = asyncio.get_running_loop()
            if len(body) > _INLINE_DECODE_BYTES or req.headers.get("content-encoding"):
                decoded, future = await loop.run_in_executor(None, self._accept, body, req, encoding, reserve,
                                                             several)
            elif (encoding == PROTOBUF and len(body) >= _OFFLOAD_PROTOBUF_BYTES
                  and self.intake.committer.columnar):
                decoded, future = await loop.run_in_executor(self._extractor, self._accept, body, req, encoding,
                                                             reserve, several)
            else:
                decoded, future = self._accept(body, req, encoding, reserve, several)
        except TooLarge as exc:
            raise _HttpError(413, str(exc)) from None
        except BadEncoding as exc:
            raise _HttpError(415, str(exc)) from None
        except ValueError as exc:
            raise _HttpError(400, str(exc)) from None
        except (QueueFull, Closed) as exc:
            raise _HttpError(503, f"{exc}; retry after {retry} s", retry_after=retry) from None
        return decoded, future

    def _accept(self, body: bytes, req: _Request, encoding: str, reserve: _Reserve,
                several: bool) -> tuple[Decoded, Future[CommitResult] | None]:
        data = decompress(body, req.headers.get("content-encoding"), self.intake.config.max_body_bytes)
        if data is not body:  # the inflated bytes count against the budget too
            reserve.grow(reserve.held + len(data))
        return self.intake.accept(data, encoding, peer=req.peer, journal=several)
