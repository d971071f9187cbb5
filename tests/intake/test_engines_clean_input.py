"""Good input maps cleanly: on every engine fixture and every committed sample, each engine's `map_trace` raises
nothing and `normalize` logs no warning.

`intake.engines.normalize` catches any exception of a per-trace mapper, logs a warning and stores the trace
unmapped (a mapping bug must never lose a batch), so a mapper that broke on real input would pass every
test that only reads the stored rows. Here the mappers are called directly, where an exception surfaces,
and `normalize` runs under a log capture. The native samples of the incident catalogue and the demo (no engine
span: no mapper runs) are checked where the accuracy suites ingest them (`engine_warnings`), not decoded again.
"""

from __future__ import annotations

import contextlib
import gzip
import logging
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from intake.engines import ENGINES, TRACE_ENGINES, normalize, read_json_array, vllm
from intake.engines._common import Trace
from intake.ingest import IngestReport
from intake.otlp import decode_json
from tests.intake.engine_fixtures import FIXTURES
from tracing.rows import SpanBatch

ROOT = Path(__file__).parents[2]
SAMPLES = ROOT / "sample_traces" / "data"
FILES = sorted([*FIXTURES.iterdir(), *(SAMPLES / "engines").glob("*.otlp.jsonl.gz"), SAMPLES / "basic.otlp.jsonl.gz"])
ENGINE_LOGGER = "intake.engines"


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def engine_warnings() -> Iterator[list[str]]:
    """The warnings the engine mappers log inside the block (a trace they could not map), as messages."""
    logger, kept = logging.getLogger(ENGINE_LOGGER), _Kept()
    level = logger.level
    logger.addHandler(kept)
    logger.setLevel(min(level or logging.WARNING, logging.WARNING))
    try:
        yield kept.messages
    finally:
        logger.removeHandler(kept)
        logger.setLevel(level)


def _table(path: Path) -> pa.Table:
    """Every span of a fixture or sample file, decoded as `tailscope ingest` reads it."""
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    if data.lstrip()[:1] == b"[":  # Triton's JSON trace file
        return pa.concat_tables(read_json_array(path, data, skip_bad=False, report=IngestReport()))
    batch = SpanBatch()
    for line in data.splitlines():
        if line.strip():
            decode_json(line, batch)
    return batch.to_table()


def test_every_fixture_and_sample_is_here() -> None:
    names = {p.name for p in FILES}
    assert {"vllm.otlp.jsonl", "sglang.otlp.jsonl", "tgi.otlp.jsonl", "triton.otlp.jsonl", "triton_trace.json",
            "basic.otlp.jsonl.gz", "vllm_slow_replica.otlp.jsonl.gz", "sglang_slow_replica.otlp.jsonl.gz"} <= names
    # the rest are native samples, checked where they are ingested (module docstring)
    rest = {p.name for p in SAMPLES.rglob("*.otlp.jsonl.gz")} - names
    assert rest == {"demo.otlp.jsonl.gz"} | {p.name for p in (SAMPLES / "incidents").glob("*.otlp.jsonl.gz")}


def test_a_mapping_failure_is_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    """The premise of `engine_warnings`: a mapper that raises is logged by normalize, and caught here."""
    table = _table(FIXTURES / "sglang.otlp.jsonl")

    def broken(trace: Trace) -> list[dict[str, object]]:
        raise RuntimeError("broken mapper")

    monkeypatch.setattr(TRACE_ENGINES[0], "map_trace", broken)
    with engine_warnings() as warned:
        normalize(table)
    assert warned and all(m.startswith(f"could not map a {TRACE_ENGINES[0].NAME} trace") for m in warned), warned


@pytest.mark.slow
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_map_trace_raises_nothing_and_normalize_warns_nothing(path: Path) -> None:
    table = _table(path)
    assert table.num_rows > 0
    names, scopes = table.column("SpanName"), table.column("ScopeName")
    mapped = 0
    for engine in ENGINES:
        mask = vllm.candidate_mask(names, scopes) if engine is vllm else engine.candidate_mask(names)
        trace_ids = set(table.column("TraceId").filter(mask).to_pylist())
        if not trace_ids:
            continue
        by_trace: dict[str, list[dict[str, object]]] = {}
        for row in table.filter(pc.is_in(table.column("TraceId"), pa.array(sorted(trace_ids)))).to_pylist():
            by_trace.setdefault(str(row["TraceId"]), []).append(row)
        for spans in by_trace.values():
            engine.map_trace(Trace(spans))  # an exception fails the test here
        mapped += len(by_trace)
    engines_in_name = [e.NAME for e in ENGINES if e.NAME in path.name]
    assert (mapped > 0) == bool(engines_in_name), f"{path.name}: {mapped} engine traces"
    with engine_warnings() as warned:
        out = normalize(table)
    assert warned == [], f"{path.name}: {warned[:3]}"
    assert out.num_rows >= table.num_rows
    assert set(TRACE_ENGINES) <= set(ENGINES)
