"""The request / stage API on the real SDK: names, parents, stage attributes, timing order, outcomes."""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import tracing
from tests.tracing.otel_helpers import by_name, end, parent_id, span_id, spans, start, trace_id
from tracing import schema as S

__all__ = ["spans"]

MODEL_KEY = S.MODEL_KEYS[0]
INPUT_KEY = S.INPUT_TOKEN_KEYS[0]
OUTPUT_KEY = S.OUTPUT_TOKEN_KEYS[0]


def _full_request(fail_in: str | None = None, exc: BaseException | None = None) -> None:
    """One request through every stage; raise `exc` inside stage `fail_in`."""

    def body(name: str) -> None:
        if name == fail_in:
            assert exc is not None
            raise exc

    with tracing.request(model="llama", model_version="v2", tenant="acme", input_tokens=12, stream=True) as req:
        for name in (tracing.NETWORK, tracing.QUEUE_WAIT, tracing.PREPROCESS, tracing.MODEL_LOAD):
            with req.stage(name):
                body(name)
        with req.stage(tracing.GENERATION):
            body(tracing.GENERATION)
            with req.stage(tracing.PREFILL):
                body(tracing.PREFILL)
            req.first_token()
            with req.stage(tracing.DECODE):
                body(tracing.DECODE)
        with req.stage(tracing.STREAMING):
            body(tracing.STREAMING)
        req.set(output_tokens=7)


def test_success_names_parents_attributes_and_order(spans: InMemorySpanExporter) -> None:
    _full_request()
    got = by_name(spans.get_finished_spans())
    assert set(got) == {*S.ALL_STAGES, "inference llama"}
    root = got["inference llama"]
    assert root.kind is SpanKind.SERVER and root.parent is None
    assert dict(root.attributes or {}) == {
        S.ATTR_REQUEST: True, MODEL_KEY: "llama", S.ATTR_MODEL_VERSION: "v2", S.ATTR_TENANT: "acme",
        INPUT_KEY: 12, S.ATTR_STREAMING: True, S.ATTR_OUTCOME: "ok", OUTPUT_KEY: 7,
        S.ATTR_TTFT_NS: (root.attributes or {})[S.ATTR_TTFT_NS],
    }
    assert root.status.status_code is StatusCode.UNSET
    for name in S.ALL_STAGES:
        span = got[name]
        assert span.kind is SpanKind.INTERNAL
        assert dict(span.attributes or {}) == {S.ATTR_STAGE: name}
        assert trace_id(span) == trace_id(root)
        expected_parent = got[S.STAGE_PARENT[name]] if name in S.STAGE_PARENT else root
        assert parent_id(span) == span_id(expected_parent), name
        assert start(root) <= start(span) <= end(span) <= end(root)
    order = [got[n] for n in (*S.STAGES[:4], "generation")]
    for a, b in itertools.pairwise(order):
        assert end(a) <= start(b)
    assert end(got["prefill"]) <= start(got["decode"])
    ttft = (root.attributes or {})[S.ATTR_TTFT_NS]
    assert isinstance(ttft, int)
    assert end(got["prefill"]) - start(root) <= ttft <= start(got["decode"]) - start(root)


@pytest.mark.parametrize("stage_name", S.ALL_STAGES)
def test_exception_in_each_stage_marks_stage_and_request(spans: InMemorySpanExporter, stage_name: str) -> None:
    with pytest.raises(ValueError, match="boom"):
        _full_request(stage_name, ValueError("boom"))
    got = {s.name: s for s in spans.get_finished_spans()}
    root = got["inference llama"]
    failed = got[stage_name]
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.status.description == "boom"
    assert (failed.attributes or {})[S.ATTR_ERROR_TYPE] == "ValueError"
    assert [e.name for e in failed.events] == ["exception"]
    assert root.status.status_code is StatusCode.ERROR
    assert (root.attributes or {})[S.ATTR_OUTCOME] == "error"
    assert (root.attributes or {})[S.ATTR_ERROR_TYPE] == "ValueError"
    assert root.events == ()  # the exception is recorded once, on the stage where it happened
    if stage_name in S.STAGE_PARENT:  # the enclosing generation span fails too
        assert got["generation"].status.status_code is StatusCode.ERROR
    for name, span in got.items():
        if name not in (stage_name, root.name, "generation"):
            assert span.status.status_code is StatusCode.UNSET, name


def test_exception_outside_stages_is_recorded_on_request(spans: InMemorySpanExporter) -> None:
    with pytest.raises(KeyError), tracing.request(model="m"):
        raise KeyError("k")
    (root,) = spans.get_finished_spans()
    assert (root.attributes or {})[S.ATTR_ERROR_TYPE] == "KeyError"
    assert [e.name for e in root.events] == ["exception"]


def test_timeout_gives_outcome_timeout(spans: InMemorySpanExporter) -> None:
    async def serve() -> None:
        with tracing.request(model="m") as req:
            with req.stage(tracing.QUEUE_WAIT):
                pass
            async with asyncio.timeout(0.01), req.stage(tracing.DECODE):
                await asyncio.sleep(5)

    with pytest.raises(TimeoutError):
        asyncio.run(serve())
    got = by_name(spans.get_finished_spans())
    root = got["inference m"]
    assert (root.attributes or {})[S.ATTR_OUTCOME] == "timeout"
    assert (root.attributes or {})[S.ATTR_ERROR_TYPE] == "TimeoutError"
    assert root.status.status_code is StatusCode.ERROR
    assert got["decode"].status.status_code is StatusCode.ERROR
    assert got["queue_wait"].status.status_code is StatusCode.UNSET


def test_explicit_outcome_and_times(spans: InMemorySpanExporter) -> None:
    req = tracing.request("custom", model="m", start_ns=1_000)
    req.record_stage(tracing.QUEUE_WAIT, 1_100, 1_500)
    gen = req.start_stage(tracing.GENERATION, start_ns=1_500)
    req.record_stage(tracing.PREFILL, 1_500, 1_700)
    gen.end(2_000)
    req.first_token(1_700)
    req.set_outcome("cancelled", "ClientGone")
    req.end(2_500)
    got = by_name(spans.get_finished_spans())
    assert (got["custom"].start_time, got["custom"].end_time) == (1_000, 2_500)
    assert (got["queue_wait"].start_time, got["queue_wait"].end_time) == (1_100, 1_500)
    assert parent_id(got["prefill"]) == span_id(got["generation"])
    attrs = got["custom"].attributes or {}
    assert attrs[S.ATTR_OUTCOME] == "cancelled" and attrs[S.ATTR_ERROR_TYPE] == "ClientGone"
    assert attrs[S.ATTR_TTFT_NS] == 700
    assert got["custom"].status.status_code is StatusCode.ERROR


def test_rules_are_enforced() -> None:
    with pytest.raises(ValueError, match="stage must be one of"):
        tracing.stage("tokenize")
    req = tracing.request(model="m")
    with pytest.raises(ValueError, match="outcome must be one of"):
        req.set_outcome("fine")
    req.end()


def test_decorators_sync_and_async(spans: InMemorySpanExporter) -> None:
    @tracing.stage(tracing.PREPROCESS)
    def tokenize(text: str) -> list[str]:
        return text.split()

    @tracing.stage(tracing.GENERATION)
    async def generate(n: int) -> int:
        await asyncio.sleep(0)
        return n

    @tracing.traced_request(model="m", tenant="t")
    async def handler(text: str) -> int:
        current = tracing.current_request()
        assert current is not None
        current.set(output_tokens=3)
        return await generate(len(tokenize(text)))

    assert asyncio.run(handler("a b c")) == 3
    got = by_name(spans.get_finished_spans())
    root = got["inference m"]
    assert parent_id(got["preprocess"]) == span_id(root)
    assert parent_id(got["generation"]) == span_id(root)
    assert (root.attributes or {})[OUTPUT_KEY] == 3
    with pytest.raises(TypeError, match="generator"):
        tracing.stage(tracing.DECODE)(lambda: (yield 1))


def test_stages_in_threads(spans: InMemorySpanExporter) -> None:
    with tracing.request(model="m") as req, ThreadPoolExecutor(2) as pool:
        pool.submit(lambda: req.stage(tracing.PREPROCESS).__enter__().end()).result()

        def in_worker() -> str:
            with tracing.stage(tracing.GENERATION):  # found through the copied context
                return threading.current_thread().name

        ctx = contextvars.copy_context()
        worker = pool.submit(ctx.run, in_worker).result()
        assert worker != threading.current_thread().name
    got = by_name(spans.get_finished_spans())
    root = got["inference m"]
    assert parent_id(got["preprocess"]) == span_id(root)
    assert parent_id(got["generation"]) == span_id(root)


def test_stage_outside_a_request_is_kept(spans: InMemorySpanExporter) -> None:
    tracer = trace.get_tracer("host")
    with tracer.start_as_current_span("host-span") as host, tracing.stage(tracing.PREPROCESS):
        pass
    got = by_name(spans.get_finished_spans())
    assert parent_id(got["preprocess"]) == host.get_span_context().span_id


def test_100_interleaved_asyncio_requests_never_mix(spans: InMemorySpanExporter) -> None:
    async def one(i: int) -> None:
        with tracing.request(model="m", tenant=f"t{i}") as req:
            for k, name in enumerate((tracing.QUEUE_WAIT, tracing.PREPROCESS, tracing.GENERATION)):
                async with tracing.stage(name, index=i):
                    await asyncio.sleep(((i * 7 + k * 3) % 5) / 1000)
                    if name == tracing.GENERATION:
                        for part in (tracing.PREFILL, tracing.DECODE):
                            with tracing.stage(part, index=i):
                                await asyncio.sleep(((i + k) % 3) / 1000)
            req.set(output_tokens=i)

    async def main() -> None:
        await asyncio.gather(*(one(i) for i in range(100)))

    asyncio.run(main())
    finished = spans.get_finished_spans()
    roots = [s for s in finished if s.kind is SpanKind.SERVER]
    assert len(roots) == 100 and len(finished) == 600
    ids = {span_id(s): s for s in finished}
    for root in roots:
        i = int(str((root.attributes or {})[S.ATTR_TENANT])[1:])
        assert (root.attributes or {})[OUTPUT_KEY] == i
        mine = [s for s in finished if trace_id(s) == trace_id(root) and s is not root]
        assert sorted(s.name for s in mine) == sorted(["queue_wait", "preprocess", "generation", "prefill", "decode"])
        for s in mine:
            assert (s.attributes or {})["index"] == i
            pid = parent_id(s)
            assert pid is not None
            parent = ids[pid]
            assert parent is (root if s.name not in S.STAGE_PARENT else
                              next(x for x in mine if x.name == "generation"))


def test_an_asyncio_cancellation_is_known_without_importing_asyncio_first() -> None:
    """instrument names asyncio's CancelledError without importing asyncio: the name it checks against is the one
    error_type_of gives, and the outcome of a cancellation is `cancelled`, of any other error `error`."""
    import asyncio

    from tracing import instrument as I

    assert I.error_type_of(asyncio.CancelledError()) == I._CANCELLED_TYPE
    assert I.outcome_of_exception(asyncio.CancelledError()) == "cancelled"
    assert I.outcome_of_exception(RuntimeError("x")) == "error"
