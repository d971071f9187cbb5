"""One replica of the example inference server: HTTP/1.1 + SSE, admission queue, batching worker.

POST /v1/completions  {"prompt": str, "max_tokens": int, "stream": bool, "tenant": str,
                       "timeout_s": float}
GET  /health

Every request is one trace: the request span (continuing the client's W3C context) with
network (reading the request), preprocess (tokenize, validate), queue_wait (admitted until
a batch takes it), model_load (cold start), generation (prefill, decode) and streaming.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

import tracing
from examples.model import StandInModel
from tracing.instrument import StageSpan

_now = time.time_ns
MAX_BODY = 1 << 20


class HttpError(Exception):
    """A request the server refuses: status code and the error type recorded on the request."""

    def __init__(self, status: int, error_type: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type


@dataclass
class Job:
    """One admitted request waiting for, then inside, a batch."""

    req: tracing.Request
    input_tokens: int
    max_tokens: int
    queued: StageSpan
    tokens: asyncio.Queue[str | None] = field(default_factory=asyncio.Queue)
    cancelled: bool = False
    generated: int = 0
    gen: StageSpan | None = None
    decode_start: int = 0


class Replica:
    """An HTTP server with an admission queue and one batching worker over a stand-in model."""

    def __init__(self, model: StandInModel, *, max_batch: int = 8, queue_size: int = 256,
                 batch_wait_s: float = 0.002, default_timeout_s: float = 30.0) -> None:
        self.model = model
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_s
        self.default_timeout_s = default_timeout_s
        self.queue: asyncio.Queue[Job] = asyncio.Queue(maxsize=queue_size)
        self._worker: asyncio.Task[None] | None = None

    # --- the batching worker ---------------------------------------------------------------

    async def _take_batch(self) -> list[Job]:
        batch = [await self.queue.get()]
        deadline = time.monotonic() + self.batch_wait_s
        while len(batch) < self.max_batch:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self.queue.get(), remaining))
            except TimeoutError:
                break
        return batch

    async def work(self) -> None:
        """Run batches forever: prefill the batch, then decode one token per sequence per step."""
        while True:
            batch = [job for job in await self._take_batch() if not job.cancelled]
            taken = _now()
            for job in batch:
                job.queued.end(taken)
            if not batch:
                continue
            if not self.model.loaded:
                await self.model.load()
                loaded = _now()
                for job in batch:
                    job.req.record_stage(tracing.MODEL_LOAD, taken, loaded)
            start = _now()
            for job in batch:
                job.gen = job.req.start_stage(tracing.GENERATION, start_ns=start)
            await self.model.prefill(sum(job.input_tokens for job in batch))
            prefilled = _now()
            for job in batch:
                job.req.record_stage(tracing.PREFILL, start, prefilled)
                job.decode_start = prefilled
            active = batch
            while active:
                await self.model.decode_step(len(active))
                now = _now()
                still: list[Job] = []
                for job in active:
                    if job.cancelled:
                        self._close(job, now, tracing.ClientDisconnected("client went away"))
                        continue
                    job.tokens.put_nowait(self.model.token(job.generated))
                    job.generated += 1
                    if job.generated >= job.max_tokens:
                        self._close(job, now, None)
                        job.tokens.put_nowait(None)
                    else:
                        still.append(job)
                active = still

    def _close(self, job: Job, now: int, exc: BaseException | None) -> None:
        decode = job.req.start_stage(tracing.DECODE, start_ns=job.decode_start)
        if exc is not None:
            decode.fail(exc)
            if job.gen is not None:
                job.gen.fail(exc)
        decode.end(now)
        if job.gen is not None:
            job.gen.end(now)

    # --- HTTP ------------------------------------------------------------------------------

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one connection (one request, then close)."""
        try:
            await self._handle(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        t0 = _now()
        if not line:
            return
        method, path, _ = line.decode("latin-1").split(" ", 2)
        headers: dict[str, str] = {}
        while (raw := await reader.readline()) not in (b"\r\n", b"\n", b""):
            key, _, value = raw.decode("latin-1").partition(":")
            headers[key.strip().lower()] = value.strip()
        if method == "GET" and path.startswith("/health"):
            await _respond(writer, 200, {"status": "ok", "model_loaded": self.model.loaded})
            return
        if method != "POST" or not path.startswith("/v1/completions"):
            await _respond(writer, 404, {"error": f"no route for {method} {path}"})
            return
        length = int(headers.get("content-length", "0"))
        body = await reader.readexactly(min(length, MAX_BODY))
        t1 = _now()
        try:
            payload = json.loads(body or b"{}")
        except ValueError:
            payload = None
        shape = payload if isinstance(payload, dict) else {}
        stream = bool(shape.get("stream", False))
        req = tracing.request(model=self.model.name, model_version=self.model.version,
                              tenant=str(shape.get("tenant", "default")), stream=stream,
                              operation="text_completion", carrier=headers, start_ns=t0)
        req.record_stage(tracing.NETWORK, t0, t1)
        disconnected = asyncio.Event()
        watcher = asyncio.create_task(_watch_eof(reader, disconnected))
        state = {"sent_headers": False}
        try:
            with req:
                try:
                    if not isinstance(payload, dict):
                        raise HttpError(400, "invalid_request", "body must be a JSON object")
                    timeout = float(payload.get("timeout_s", self.default_timeout_s))
                    async with asyncio.timeout(timeout):
                        await self._serve(req, payload, stream, writer, disconnected, state)
                except HttpError as err:
                    req.set_outcome("error", err.error_type)
                    await _respond(writer, err.status, {"error": str(err), "type": err.error_type})
        except TimeoutError:
            if not state["sent_headers"]:
                await _respond(writer, 504, {"error": "timed out", "type": "timeout"})
        except (tracing.ClientDisconnected, ConnectionError):
            pass
        finally:
            watcher.cancel()

    async def _serve(self, req: tracing.Request, payload: dict[str, Any], stream: bool,
                     writer: asyncio.StreamWriter, disconnected: asyncio.Event, state: dict[str, bool]) -> None:
        with req.stage(tracing.PREPROCESS):
            prompt = payload.get("prompt")
            max_tokens = payload.get("max_tokens", 16)
            if not isinstance(prompt, str) or not isinstance(max_tokens, int) or not 0 < max_tokens <= 4096:
                raise HttpError(400, "invalid_request", "need a string prompt and 0 < max_tokens <= 4096")
            tokens = self.model.tokenize(prompt)
            await asyncio.sleep(self.model.costs.tokenize_s_per_token * len(tokens))
            req.set(input_tokens=len(tokens))
        job = Job(req, len(tokens), max_tokens, req.start_stage(tracing.QUEUE_WAIT))
        try:
            self.queue.put_nowait(job)
        except asyncio.QueueFull:
            job.queued.end()
            raise HttpError(429, "overloaded", "admission queue is full") from None
        try:
            if stream:
                await _write_head(writer, 200, "text/event-stream")
                state["sent_headers"] = True
            texts: list[str] = []
            async with tracing.stream(_drain(job, disconnected)) as out:
                async for tok in out:
                    if stream:
                        writer.write(b"data: " + json.dumps({"token": tok}).encode() + b"\n\n")
                        await writer.drain()
                    else:
                        texts.append(tok)
                if stream:
                    writer.write(b"data: [DONE]\n\n")
                    await writer.drain()
                else:
                    await _respond(writer, 200, {"text": " ".join(texts), "output_tokens": len(texts)})
        finally:
            if job.generated < job.max_tokens:
                job.cancelled = True
            if not job.queued.ended:
                job.queued.end()


async def _watch_eof(reader: asyncio.StreamReader, disconnected: asyncio.Event) -> None:
    """Set `disconnected` when the client closes its side (a read returns EOF)."""
    with contextlib.suppress(Exception):
        while await reader.read(4096):
            pass
    disconnected.set()


async def _drain(job: Job, disconnected: asyncio.Event) -> Any:
    """The tokens of one job as they are produced; stops with ClientDisconnected if the client left."""
    gone = asyncio.create_task(disconnected.wait())
    try:
        while True:
            get = asyncio.create_task(job.tokens.get())
            done, _ = await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
            if get not in done:
                get.cancel()
                job.cancelled = True
                raise tracing.ClientDisconnected("client closed the connection")
            tok = get.result()
            if tok is None:
                return
            yield tok
    finally:
        gone.cancel()


async def _write_head(writer: asyncio.StreamWriter, status: int, content_type: str,
                      length: int | None = None) -> None:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 429: "Too Many Requests",
              504: "Gateway Timeout"}.get(status, "Error")
    head = [f"HTTP/1.1 {status} {reason}", f"Content-Type: {content_type}", "Connection: close",
            "Cache-Control: no-cache"]
    if length is not None:
        head.append(f"Content-Length: {length}")
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
    await writer.drain()


async def _respond(writer: asyncio.StreamWriter, status: int, body: Any) -> None:
    data = json.dumps(body).encode()
    await _write_head(writer, status, "application/json", len(data))
    writer.write(data)
    await writer.drain()


async def serve(replica: Replica, host: str, port: int, ready: Any = None,
                stop: asyncio.Event | None = None) -> None:
    """Serve `replica` on host:port until `stop` is set (forever without one).

    `ready(port)` is called with the bound port once connections are accepted (port 0 binds any free one).
    """
    server = await asyncio.start_server(replica.handle, host, port, backlog=512)
    worker = asyncio.create_task(replica.work())
    if ready is not None:
        ready(server.sockets[0].getsockname()[1])
    try:
        async with server:
            if stop is None:
                await server.serve_forever()
            else:
                await stop.wait()
    finally:
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
