"""`emit.span_tables` (the simulated requests' rows built column by column: what the seeded accuracy runs store)
against a simple reference: every request recorded one at a time through the lean recorder (`emit._record` into
a `tracing.LeanRecorder` writing a store: the rows it stores are those `tailscope ingest` stores from the OTLP
emission of the same `_record`, which test_sampling_accuracy.py checks). Every catalogue entry, on a fleet made
to fail often (engine errors, rejections, deadlines), each with and without a head sampler's `keep`, on several
seeds: the stored spans must be equal, row for row and in order.

Both builders take a request's stages from one description (`emit._opened`, clipped by `emit._kept`), evaluated on
one request's times or on arrays of them; what this compares is everything else: the vectorized clipping, ids,
attributes, outcomes and row order against the recorder's. The description itself is pinned by the committed samples,
which `_record` makes (test_committed_samples.py regenerates them and compares their text)."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest

from sample_traces.emit import _by_replica, _record, span_tables, write_store
from sample_traces.fleet import FleetConfig, SimRequest, default_config, sim_ns
from sample_traces.incidents import CATALOGUE, run
from tests.sample_traces import sampled_copy as C
from tracing.lean import LeanRecorder

#: Length of each run (s): the cold start's 90 s model load and every incident's window fit in it.
RUN_S = 100.0
#: Requests per second (few: the reference is slow).
RATE = 4.0


def failing_fleet(duration_s: float) -> FleetConfig:
    """The default fleet with 5 % of requests failing (rejected or cut by an engine error) and every tenant's
    deadline at 4 s, so each outcome's rows (status, message, clipped stages, no first token) are many."""
    cfg = default_config(duration_s, RATE)
    return replace(cfg, error_rate=0.05, tenants=tuple(replace(t, deadline_s=4.0) for t in cfg.tenants))


class _Predrawn:
    """Ids drawn ahead, in the order the recorder asks for them (each kept request's trace id, then its spans')."""

    def __init__(self) -> None:
        self.traces: deque[int] = deque()
        self.spans: deque[int] = deque()

    def generate_trace_id(self) -> int:
        return self.traces.popleft()

    def generate_span_id(self) -> int:
        return self.spans.popleft()


class _Tables:
    """A writer keeping the tables a recorder writes (in place of a store's SegmentWriter)."""

    def __init__(self) -> None:
        self.tables: list[pa.Table] = []

    def write(self, table: pa.Table) -> None:
        self.tables.append(table)


def lean_tables(cfg: FleetConfig, requests: list[SimRequest], seed: int,
                keep: Callable[[int], bool] | None) -> list[pa.Table]:
    """The reference: per replica, each request through `_record` into a lean recorder (with a head sampler's
    `keep`: every request's ids drawn, only the kept requests finished); the tables it writes."""
    writer = _Tables()
    for resource, ids, reqs in _by_replica(cfg, requests, seed):
        drawn = _Predrawn() if keep is not None else None
        rec = LeanRecorder(writer=writer, resource=resource, background=False,  # type: ignore[arg-type]  # a stand-in writer
                           id_generator=drawn or ids, max_pending=max(1, len(reqs)))  # type: ignore[arg-type]  # pre-drawn ids
        for req in reqs:
            if drawn is None or keep is None:
                _record(rec, cfg, req)
                continue
            lean = _record(rec, cfg, req, finish=False)
            trace_id = ids.generate_trace_id()
            spans = [ids.generate_span_id() for _ in range(1 + len(lean.stages))]
            if keep(trace_id):
                drawn.traces.append(trace_id)
                drawn.spans.extend(spans)
                lean.finish(sim_ns(req.end_s))
        rec.close()
    return writer.tables


#: What every run of the failing fleet holds, so each comparison covers it: every outcome, both stream modes, every
#: stage but the model load (the cold start's own).
COMMON = {"ok", "InvalidRequestError", "EngineDeadError", "DeadlineExceeded", "stream=False", "stream=True",
          "queue_wait", "network", "preprocess", "generation", "prefill", "decode", "streaming"}


@pytest.mark.parametrize("name", [inc.name for inc in CATALOGUE])
def test_the_columns_are_the_lean_recorders_rows(name: str) -> None:
    seed = 1 + [inc.name for inc in CATALOGUE].index(name) % 5
    scenario = run(name, seed, base=failing_fleet(RUN_S))
    held = Counter(r.error_type or r.status for r in scenario.requests)
    held.update(f"stream={r.streaming}" for r in scenario.requests)
    for keep in (None, C.keeps(0.25)):
        label = "all" if keep is None else "kept"
        want = lean_tables(scenario.config, scenario.requests, seed, keep)
        got = [t for t in span_tables(scenario.config, scenario.requests, seed, keep) if t.num_rows]
        assert len(got) == len(want) and all(g.equals(w) for g, w in zip(got, want, strict=True)), label
        want_all = pa.concat_tables(want)
        if keep is None:
            held.update(s for s in want_all.column("Stage").to_pylist() if s)
    assert all(held[c] >= 3 for c in COMMON), held
    assert (held["model_load"] > 0) == (name == "cold_start"), held


def test_a_kept_copy_is_the_consistent_sample_of_the_whole(tmp_path: Path) -> None:
    """`span_tables` with `keep` and the sampler's tracestate: the rows `C.consistent_sample` keeps of the whole
    store, with the same `ot=th` and adjusted counts (the quarter-sampled accuracy runs' copies)."""
    scenario = run("cold_start", 3, base=failing_fleet(RUN_S))
    whole = C.read_spans(write_store(tmp_path / "whole", scenario.config, scenario.requests, 3))
    want = C.consistent_sample(whole, lambda r: 0.25)
    state = f"ot=th:{C.th_text(C.threshold(0.25))}"
    got = pa.concat_tables(span_tables(scenario.config, scenario.requests, 3, C.keeps(0.25), state))
    assert 0.2 < want.num_rows / whole.num_rows < 0.3 and got.equals(want)
    assert set(got.column("AdjustedCount").to_pylist()) == {4.0}
