"""The request model against an independent per-instant reference (tests/analysis/request_oracle.py).

Thousands of seeded random traces with small integer times: streaming only, stages outliving or
preceding the request, prefill/decode under generation, stages under non-stage spans, streaming
under generation, repeated and overlapping stages, clock skew, duplicate request and stage spans,
requests with no stage. Every column the reference computes must match, on the fly and from
materialized hours; other_ns is never negative.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from analysis import connect
from analysis.engine.materialize import materialize
from tests.analysis.request_oracle import Span, reference
from tests.factory import T0
from tracing import schema as S
from tracing.rows import SpanBatch
from tracing.store import SegmentWriter

N_TRACES = 2500
CHECKED = ("e2e_ns", *(f"{s}_ns" for s in S.CRITICAL_PATH_COLUMNS), "ttft_ns", "tpot_ns", "replica",
           "client_e2e_ns")
STAGE_CHOICES = (*S.ALL_STAGES, "streaming", "streaming", "decode")  # streaming and decode more often


def _random_trace(rng: random.Random, n: int) -> list[Span]:
    trace = f"{n:032x}"
    ids = iter(range(1, 10_000))

    def sid() -> str:
        return f"{n:08x}{next(ids):08x}"

    skew = rng.choice((0, 0, 0, -7, 5))  # a worker whose clock runs ahead / behind the gateway
    # the first requests of the run start just after the hour: stages before them lie in the previous hour
    rs = (rng.randint(0, 10) if n < 50 else rng.randint(0, 100_000)) + (0 if n < 50 else 10_000)
    re = rs + rng.randint(0, 40)
    out: list[Span] = []
    client = ""
    if rng.random() < 0.15:
        client = sid()
        out.append(Span(trace, client, "", None, False, rs - rng.randint(0, 5), re + rng.randint(0, 5),
                        replica="client", kind="Client"))
    req = Span(trace, sid(), client, None, True, rs, re, replica=rng.choice(("gw-0", "gw-1", None)),
               ttft=rng.choice((None, None, None, rng.randint(0, 30))), output_tokens=rng.choice((None, 0, 1, 2, 7)))
    out.append(req)
    if rng.random() < 0.05:  # the same request span stored twice (maybe with other times)
        same = rng.random() < 0.5
        out.append(Span(trace, req.id, client, None, True, rs if same else rs + rng.randint(-3, 3),
                        re if same else re + rng.randint(-3, 3), replica=req.replica, ttft=req.ttft,
                        output_tokens=req.output_tokens))
    shape = rng.random()
    if shape < 0.08:
        return out  # no stages
    if shape < 0.2:  # streaming only (README's tracing.request + tracing.stream)
        out.append(Span(trace, sid(), req.id, "streaming", False, rs + rng.randint(-2, 10), re + rng.randint(-2, 4)))
        return out
    handler = sid()
    if rng.random() < 0.2:  # a non-stage span between the request and a stage: not read
        out.append(Span(trace, handler, req.id, None, False, rs, re))
    for _ in range(rng.randint(1, 6)):
        stage = rng.choice(STAGE_CHOICES)
        s = rs + rng.randint(-10, 40) + skew
        e = s + rng.randint(0, 30)
        parent = handler if rng.random() < 0.1 else req.id
        span = Span(trace, sid(), parent, stage, False, s, e, replica=rng.choice(("w-0", "w-1", "w-2", None)))
        out.append(span)
        if rng.random() < 0.05:  # a stage span stored twice
            out.append(Span(trace, span.id, parent, stage, False, s + rng.randint(0, 3), e,
                            replica=span.replica))
        for _ in range(rng.choice((0, 0, 1, 2, 3))):
            kid = rng.choice(("prefill", "decode", "decode", "streaming", "queue_wait"))
            ks = s + rng.randint(-5, 25)
            kspan = Span(trace, sid(), span.id, kid, False, ks, ks + rng.randint(0, 20),
                         replica=rng.choice(("w-0", "w-3", None)))
            out.append(kspan)
            if rng.random() < 0.2:  # level 3: not read
                out.append(Span(trace, sid(), kspan.id, "decode", False, ks, ks + 10, replica="w-9"))
    return out


def _store(tmp_path: Path, spans: list[Span]) -> Path:
    batch = SpanBatch()
    for sp in spans:
        attrs = {S.ATTR_REQUEST: "true" if sp.request else "false"}
        if sp.stage:
            attrs[S.ATTR_STAGE] = sp.stage
        if sp.ttft is not None:
            attrs[S.ATTR_TTFT_NS] = str(sp.ttft)
        if sp.output_tokens is not None:
            attrs["gen_ai.usage.output_tokens"] = str(sp.output_tokens)
        batch.append(trace_id=sp.trace, span_id=sp.id, parent_span_id=sp.parent, name=sp.stage or "op",
                     kind=sp.kind, start_ns=T0 + sp.start, end_ns=T0 + sp.end, service="llm", resource={},
                     attrs=attrs, replica=sp.replica)
    store = tmp_path / "store"
    # two writers, so the spans of one request may lie in several segments
    table = batch.to_table()
    half = table.num_rows // 2
    SegmentWriter(store, kind="a").write(table.slice(0, half))
    SegmentWriter(store, kind="b").write(table.slice(half))
    return store


@pytest.fixture(scope="module")
def random_traces(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[tuple[str, str], dict[str, Any]]]:
    rng = random.Random(20251120)
    spans = [sp for n in range(N_TRACES) for sp in _random_trace(rng, n)]
    return _store(tmp_path_factory.mktemp("oracle"), spans), reference([
        Span(sp.trace, sp.id, sp.parent, sp.stage, sp.request, T0 + sp.start, T0 + sp.end, sp.replica, sp.ttft,
             sp.output_tokens, sp.kind) for sp in spans])


def _rows(store: Path) -> dict[tuple[str, str], dict[str, Any]]:
    con = connect(store)
    frame = con.execute(f"SELECT trace_id, span_id, {', '.join(CHECKED)} FROM requests").fetchall()
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for row in frame:
        key = (row[0], row[1])
        assert key not in rows, f"request {key} appears twice"
        rows[key] = dict(zip(CHECKED, row[2:], strict=True))
    return rows


def _compare(got: dict[tuple[str, str], dict[str, Any]], want: dict[tuple[str, str], dict[str, Any]]) -> None:
    assert set(got) == set(want)
    bad = [(k, c, got[k][c], want[k][c]) for k in want for c in CHECKED if got[k][c] != want[k][c]]
    assert not bad, f"{len(bad)} mismatches, first: {bad[:5]}"
    assert all(r["other_ns"] >= 0 for r in got.values())
    # sanity of the generator: the hard cases are present
    assert sum(1 for r in want.values() if r["streaming_ns"] > 0 and r["streaming_ns"] + r["other_ns"]
               == r["e2e_ns"]) > 50
    assert sum(1 for r in want.values() if r["prefill_ns"] > 0) > 100


def test_requests_on_the_fly_match_the_per_instant_reference(random_traces: Any) -> None:
    store, want = random_traces
    _compare(_rows(store), want)


def test_materialized_requests_match_the_per_instant_reference(random_traces: Any, tmp_path: Path) -> None:
    import shutil

    store = tmp_path / "copy"
    shutil.copytree(random_traces[0], store)
    built = materialize(store)
    assert len(built) == 2  # the hour before T0 (stages preceding the first requests) and T0's hour
    con = connect(store)
    assert con.execute("SELECT count(*) FROM _requests_live").fetchone() == (0,)
    _compare(_rows(store), random_traces[1])


def test_streaming_only_request_gets_its_streaming_time(tmp_path: Path) -> None:
    spans = [Span("a" * 32, "b" * 16, "", None, True, 0, 100),
             Span("a" * 32, "c" * 16, "b" * 16, "streaming", False, 20, 100)]
    store = _store(tmp_path, spans)
    row = connect(store).execute("SELECT streaming_ns, other_ns, ttft_ns FROM requests").fetchone()
    assert row == (80, 20, 20)


def test_exclusive_stretches_add_up_to_the_stage_columns(random_traces: Any) -> None:
    from analysis.engine.model import exclusive_stretches, stretches_sql

    store, want = random_traces
    con = connect(store)
    cur = con.execute(stretches_sql("spans"))
    names = [c[0] for c in cur.description or []]
    rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    stage_of = {(r["request_span_id"], r["span_id"], r["s0"]): r["stage"] for r in rows}
    trace_of = {r["request_span_id"]: r["trace_id"] for r in rows}
    got: dict[tuple[str, str], dict[str, int]] = {}
    for key, ivs in exclusive_stretches(rows).items():
        cols = got.setdefault((trace_of[key[0]], key[0]), {})
        col = f"{stage_of[key]}_ns"
        cols[col] = cols.get(col, 0) + sum(b - a for a, b in ivs)
    assert got, "no stretches"
    for req, cols in got.items():
        for col, ns in cols.items():
            assert want[req][col] == ns, (req, col)


def test_request_facts_match_the_per_instant_reference(random_traces: Any) -> None:
    from analysis.engine.percentiles import request_facts

    store, want = random_traces
    con = connect(store)
    table = request_facts(con, with_ttft=True)
    cols = ("e2e_ns", "ttft_ns", "tpot_ns", "replica")
    got: dict[str, list[tuple[Any, ...]]] = {}
    for trace, start, *vals in con.execute(f"SELECT trace_id, start_ns, {', '.join(cols)} FROM {table}").fetchall():
        got.setdefault(trace, []).append((start, *vals))
    ref: dict[str, list[tuple[Any, ...]]] = {}
    starts = dict(con.execute("SELECT span_id, start_ns FROM requests").fetchall())
    for (trace, span), row in want.items():
        ref.setdefault(trace, []).append((starts[span], *(row[c] for c in cols)))
    assert {k: sorted(v, key=str) for k, v in got.items()} == {k: sorted(v, key=str) for k, v in ref.items()}
