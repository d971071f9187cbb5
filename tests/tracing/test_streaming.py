"""Streaming: TTFT, the streaming stage, output tokens, and a client that goes away mid-stream."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import tracing
from tests.tracing.otel_helpers import by_name, end, parent_id, span_id, spans, start
from tracing import schema as S

__all__ = ["spans"]

OUTPUT_KEY = S.OUTPUT_TOKEN_KEYS[0]


def _tokens(n: int) -> Iterator[str]:
    yield from (f"t{i}" for i in range(n))


async def _atokens(n: int, delay: float = 0.0) -> AsyncIterator[str]:
    for i in range(n):
        await asyncio.sleep(delay)
        yield f"t{i}"


def test_sync_stream_records_ttft_stage_and_tokens(spans: InMemorySpanExporter) -> None:
    with tracing.request(model="m", stream=True) as req:
        with req.stage(tracing.PREFILL):
            pass
        with tracing.stream(_tokens(5)) as out:
            got_tokens = list(out)
    assert got_tokens == [f"t{i}" for i in range(5)]
    got = by_name(spans.get_finished_spans())
    root, streaming = got["inference m"], got["streaming"]
    attrs = root.attributes or {}
    assert attrs[OUTPUT_KEY] == 5 and attrs[S.ATTR_OUTCOME] == "ok"
    assert attrs[S.ATTR_TTFT_NS] == start(streaming) - start(root)
    assert parent_id(streaming) == span_id(root)
    assert (streaming.attributes or {})[S.ATTR_STAGE] == "streaming"
    assert end(got["prefill"]) <= start(streaming) <= end(streaming) <= end(root)
    assert streaming.status.status_code is StatusCode.UNSET


def test_async_stream_with_count_and_end_request(spans: InMemorySpanExporter) -> None:
    async def handler() -> list[str]:
        req = tracing.request(model="m", stream=True)
        out = tracing.stream(_atokens(4, 0.001), req, count=lambda chunk: 2, end_request=True)
        return [tok async for tok in out]  # the stream ends the request

    assert len(asyncio.run(handler())) == 4
    got = by_name(spans.get_finished_spans())
    attrs = got["inference m"].attributes or {}
    assert attrs[OUTPUT_KEY] == 8 and attrs[S.ATTR_OUTCOME] == "ok"
    assert end(got["streaming"]) <= end(got["inference m"])


def test_client_disconnect_on_a_real_socket_is_cancelled(spans: InMemorySpanExporter) -> None:
    server, client = socket.socketpair()
    sent = 0
    with pytest.raises((BrokenPipeError, ConnectionResetError)), tracing.request(model="m", stream=True):  # noqa: SIM117
        with tracing.stream(_tokens(10_000)) as out:
            for tok in out:
                if sent == 3:
                    client.close()  # the client goes away after three tokens
                server.sendall(tok.encode())
                sent += 1
    server.close()
    got = by_name(spans.get_finished_spans())
    root, streaming = got["inference m"], got["streaming"]
    attrs = root.attributes or {}
    assert attrs[S.ATTR_OUTCOME] == "cancelled"
    assert attrs[S.ATTR_ERROR_TYPE] in ("BrokenPipeError", "ConnectionResetError")
    assert attrs[OUTPUT_KEY] == sent + 1  # tokens taken from the source, the last one unsent
    assert root.status.status_code is StatusCode.ERROR
    assert streaming.status.status_code is StatusCode.ERROR


def test_consumer_stopping_early_is_cancelled_unless_finished(spans: InMemorySpanExporter) -> None:
    with tracing.request("a", model="m") as req:
        out = tracing.stream(_tokens(10), req)
        next(out)
        out.close()
    with tracing.request("b", model="m") as req:
        out = tracing.stream(_tokens(10), req)
        next(out)
        out.finish()  # a stop sequence: done on purpose
    got = by_name([s for s in spans.get_finished_spans() if s.name in ("a", "b")])
    assert (got["a"].attributes or {})[S.ATTR_OUTCOME] == "cancelled"
    assert (got["a"].attributes or {})[S.ATTR_ERROR_TYPE] == "tracing.instrument.ClientDisconnected"
    assert (got["b"].attributes or {})[S.ATTR_OUTCOME] == "ok"
    assert (got["b"].attributes or {})[OUTPUT_KEY] == 1


def test_source_error_mid_stream_is_an_error(spans: InMemorySpanExporter) -> None:
    def broken() -> Iterator[str]:
        yield "a"
        raise RuntimeError("GPU fell off the bus")

    with pytest.raises(RuntimeError), tracing.request(model="m") as req, tracing.stream(broken(), req) as out:
        for _ in out:
            pass
    got = by_name(spans.get_finished_spans())
    attrs = got["inference m"].attributes or {}
    assert attrs[S.ATTR_OUTCOME] == "error" and attrs[S.ATTR_ERROR_TYPE] == "RuntimeError"
    assert got["streaming"].status.status_code is StatusCode.ERROR


def test_task_cancelled_mid_stream_is_cancelled(spans: InMemorySpanExporter) -> None:
    started = asyncio.Event()

    async def handler() -> None:
        with tracing.request(model="m", stream=True):
            async with tracing.stream(_atokens(1000, 0.001)) as out:
                async for _ in out:
                    started.set()

    async def main() -> None:
        task = asyncio.create_task(handler())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    got = by_name(spans.get_finished_spans())
    attrs = got["inference m"].attributes or {}
    assert attrs[S.ATTR_OUTCOME] == "cancelled"
    assert attrs[S.ATTR_ERROR_TYPE] == "asyncio.exceptions.CancelledError"


def test_stream_without_request_passes_tokens_through(spans: InMemorySpanExporter) -> None:
    assert list(tracing.stream(_tokens(3))) == ["t0", "t1", "t2"]
    assert spans.get_finished_spans() == ()


def test_timeout_mid_stream_is_a_timeout(spans: InMemorySpanExporter) -> None:
    async def handler() -> None:
        with tracing.request(model="m", stream=True):
            async with asyncio.timeout(0.05):
                async with tracing.stream(_atokens(10_000, 0.001)) as out:
                    async for _ in out:
                        pass

    with pytest.raises(TimeoutError):
        asyncio.run(handler())
    got = by_name(spans.get_finished_spans())
    attrs = got["inference m"].attributes or {}
    assert attrs[S.ATTR_OUTCOME] == "timeout" and attrs[S.ATTR_ERROR_TYPE] == "TimeoutError"
    assert got["streaming"].status.status_code is StatusCode.ERROR
    tokens = attrs[OUTPUT_KEY]
    assert isinstance(tokens, int) and tokens > 0


def test_stream_left_open_is_closed_with_the_request(spans: InMemorySpanExporter) -> None:
    with tracing.request(model="m", stream=True) as req:
        out = tracing.stream(_tokens(10), req)
        next(out)
        next(out)  # the handler stops reading without closing the stream
    got = by_name(spans.get_finished_spans())
    attrs = got["inference m"].attributes or {}
    assert attrs[S.ATTR_OUTCOME] == "cancelled" and attrs[OUTPUT_KEY] == 2
    assert end(got["streaming"]) <= end(got["inference m"])


def test_send_failure_without_with_still_closes_the_stream(spans: InMemorySpanExporter) -> None:
    with pytest.raises(BrokenPipeError), tracing.request(model="m", stream=True) as req:
        for i, _ in enumerate(tracing.stream(_tokens(10), req)):
            if i == 2:
                raise BrokenPipeError(32, "Broken pipe")
    got = by_name(spans.get_finished_spans())
    attrs = got["inference m"].attributes or {}
    assert attrs[S.ATTR_OUTCOME] == "cancelled" and attrs[S.ATTR_ERROR_TYPE] == "BrokenPipeError"
    assert (got["streaming"].attributes or {})[S.ATTR_ERROR_TYPE] == "BrokenPipeError"
