"""The fleet simulator, the incident catalogue and the emitter: exact properties.

Small hand-sized fleets (one replica, token counts without spread, no Poisson traffic)
give latencies that can be computed by hand from the cost model; the default fleet is
checked for invariants (stage order, slot capacity, FIFO admission, caps, determinism);
the emitted spans go through the real ingest into a real store and must give back the
simulated stage times to the nanosecond.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from analysis.engine.connect import connect
from intake.ingest import ingest_files
from sample_traces import generate
from sample_traces.emit import write_otlp
from sample_traces.fleet import (
    NS,
    START_NS,
    Burst,
    FleetConfig,
    ReplicaSpec,
    SimRequest,
    Tenant,
    Throttle,
    default_config,
    simulate,
)
from sample_traces.incidents import BY_NAME, CATALOGUE, run
from tests.sql import one
from tracing.store import init_store

IN, OUT = 1_000, 101


def tiny(**changes: Any) -> FleetConfig:
    """One replica, one tenant with fixed shapes (1000 in, 101 out), no background traffic, no errors."""
    tenant = Tenant("t", 1.0, input_median=IN, input_sigma=0.0, output_median=OUT, output_sigma=0.0,
                    stream_share=0.0, slow_reader_share=0.0)
    cfg = FleetConfig(duration_s=60.0, rate=1e-12, replicas=(ReplicaSpec("r0", "z"),), tenants=(tenant,),
                      error_rate=0.0, hop_median_s=0.0)
    return replace(cfg, **changes)


def burst(count: int, at: float = 10.0) -> tuple[Burst, ...]:
    return (Burst("t", at, count=count, spread_s=0.0),)


def prefill_s(cfg: FleetConfig, n: int = IN) -> float:
    return cfg.prefill_fixed_s + n / cfg.prefill_tokens_per_s + (n / cfg.prefill_quadratic_tokens) ** 2


def step_s(cfg: FleetConfig, busy: int) -> float:
    return cfg.step_base_s + cfg.step_per_seq_s * busy


def gen_start(cfg: FleetConfig, at: float = 10.0) -> float:
    return at + IN / cfg.tokenize_tokens_per_s + 0.002 + cfg.forward_hop_s


# --- hand-computed latencies ------------------------------------------------------------


def test_one_request_alone_costs_prefill_plus_decode_steps_at_occupancy_one() -> None:
    cfg = tiny(bursts=burst(1))
    (req,) = simulate(cfg, seed=1)
    g = gen_start(cfg)
    assert req.gen_start_s == pytest.approx(g, abs=1e-9)
    assert req.first_token_s == pytest.approx(g + prefill_s(cfg), abs=1e-9)
    assert req.decode_end_s == pytest.approx(g + prefill_s(cfg) + (OUT - 1) * step_s(cfg, 1), abs=1e-9)
    assert req.end_s == pytest.approx(req.decode_end_s + 0.002, abs=1e-9)
    assert (req.status, req.replica, req.input_tokens, req.output_tokens) == ("ok", "r0", IN, OUT)


def test_decode_step_grows_with_batch_occupancy() -> None:
    cfg = tiny(bursts=burst(3))
    reqs = simulate(cfg, seed=1)
    g = gen_start(cfg)
    for req in reqs:  # three in the batch together the whole time
        assert req.decode_end_s == pytest.approx(g + prefill_s(cfg) + (OUT - 1) * step_s(cfg, 3), abs=1e-9)


def test_full_slots_queue_fifo_until_a_slot_frees() -> None:
    cfg = tiny(bursts=burst(2), slots=1)
    first, second = simulate(cfg, seed=1)
    alone = prefill_s(cfg) + (OUT - 1) * step_s(cfg, 1)
    g = gen_start(cfg)
    assert first.decode_end_s == pytest.approx(g + alone, abs=1e-9)
    assert second.gen_start_s == pytest.approx(first.decode_end_s, abs=1e-9)
    assert second.decode_end_s == pytest.approx(g + 2 * alone, abs=1e-9)


def test_prefill_cost_grows_faster_than_linearly_with_input_tokens() -> None:
    cfg = tiny()
    assert prefill_s(cfg, 64_000) > 2 * prefill_s(cfg, 32_000)
    long_cfg = replace(cfg, tenants=(replace(cfg.tenants[0], input_median=64_000, max_input=128_000),),
                       bursts=burst(1))
    (req,) = simulate(long_cfg, seed=1)
    assert req.first_token_s - req.gen_start_s == pytest.approx(prefill_s(cfg, 64_000), abs=1e-9)


def test_throttle_multiplies_prefill_and_decode() -> None:
    cfg = tiny(bursts=burst(1), throttles=(Throttle("r0", 0.0, 60.0, factor=3.0),))
    (req,) = simulate(cfg, seed=1)
    assert req.first_token_s - req.gen_start_s == pytest.approx(3 * prefill_s(cfg), abs=1e-9)
    assert req.decode_end_s - req.first_token_s == pytest.approx(3 * (OUT - 1) * step_s(cfg, 1), abs=1e-9)


def test_cold_replica_holds_requests_in_model_load_until_loaded() -> None:
    cfg = tiny(bursts=burst(2), replicas=(ReplicaSpec("r0", "z", joins_s=5.0, load_s=20.0),))
    for req in simulate(cfg, seed=1):
        assert req.load_end_s == 25.0
        assert req.gen_start_s == 25.0
        assert req.at_replica_s < 25.0


def test_slow_reader_stretches_the_stream_past_decode() -> None:
    tenant = replace(tiny().tenants[0], stream_share=1.0, slow_reader_share=1.0)
    cfg = tiny(bursts=burst(1), tenants=(tenant,), slow_reader_tps=(10.0, 10.0))
    (req,) = simulate(cfg, seed=1)
    assert req.streaming and req.stream_end_s is not None
    assert req.stream_end_s == pytest.approx(req.first_token_s + OUT / 10.0 + 0.003, abs=1e-9)
    assert req.end_s == req.stream_end_s > req.decode_end_s


def test_tenant_concurrency_limit_queues_at_the_gateway() -> None:
    tenant = replace(tiny().tenants[0], max_concurrency=1)
    cfg = tiny(bursts=burst(3), tenants=(tenant,))
    a, b, c = simulate(cfg, seed=1)
    assert b.routed_s == pytest.approx(a.end_s - 0.002, abs=1e-9)  # admitted when a's slot frees
    assert c.routed_s == pytest.approx(b.end_s - 0.002, abs=1e-9)


def test_deadline_turns_long_requests_into_timeouts_ending_at_the_deadline() -> None:
    tenant = replace(tiny().tenants[0], deadline_s=1.0)
    (req,) = simulate(tiny(bursts=burst(1), tenants=(tenant,)), seed=1)
    assert (req.status, req.error_type) == ("timeout", "DeadlineExceeded")
    assert req.end_s == pytest.approx(req.arrival_s + 1.0, abs=1e-12)
    made = 1 + int((req.end_s - req.first_token_s) / step_s(tiny(), 1) + 1e-9)
    assert req.output_tokens == made < OUT


# --- the default fleet --------------------------------------------------------------------


@pytest.fixture(scope="module")
def fleet_run() -> list[SimRequest]:
    return simulate(default_config(duration_s=600.0, rate=10.0), seed=5)


def test_same_seed_same_run_and_another_seed_another(fleet_run: list[SimRequest]) -> None:
    cfg = default_config(duration_s=600.0, rate=10.0)
    assert simulate(cfg, seed=5) == fleet_run
    assert simulate(cfg, seed=6) != fleet_run


def test_stage_boundaries_are_ordered(fleet_run: list[SimRequest]) -> None:
    for r in fleet_run:
        load = r.load_end_s if r.load_end_s is not None else r.at_replica_s
        chain = [r.arrival_s, r.pre_end_s, r.routed_s, r.at_replica_s, load, r.gen_start_s, r.first_token_s,
                 r.decode_end_s, r.end_s]
        assert chain == sorted(chain), r
        if r.streaming and r.status == "ok":
            assert r.end_s == r.stream_end_s


def test_slots_are_never_exceeded_and_admission_is_fifo() -> None:
    cfg = replace(default_config(duration_s=300.0, rate=10.0), replicas=default_replicas_small(), slots=4)
    reqs = [r for r in simulate(cfg, seed=2) if r.error_type != "InvalidRequestError"]
    for name in {r.replica for r in reqs}:
        mine = [r for r in reqs if r.replica == name]
        events = sorted([(r.gen_start_s, 1) for r in mine] + [(r.decode_end_s, -1) for r in mine],
                        key=lambda e: (e[0], e[1]))
        busy = peak = 0
        for _, step in events:
            busy += step
            peak = max(peak, busy)
        assert peak == cfg.slots  # the load fills the slots, and never more than that
        by_arrival = sorted((r for r in mine if r.status == "ok"), key=lambda r: (r.at_replica_s, r.index))
        starts = [r.gen_start_s for r in by_arrival]
        assert starts == sorted(starts)


def default_replicas_small() -> tuple[ReplicaSpec, ...]:
    return tuple(ReplicaSpec(f"r{i}", "z") for i in range(3))


def test_shapes_are_heavy_tailed_and_capped(fleet_run: list[SimRequest]) -> None:
    tenants = {t.name: t for t in default_config().tenants}
    ins = sorted(r.input_tokens for r in fleet_run)
    outs = sorted(r.output_tokens for r in fleet_run if r.status == "ok")
    assert ins[int(0.99 * len(ins))] > 5 * ins[len(ins) // 2]
    assert outs[int(0.99 * len(outs))] > 3 * outs[len(outs) // 2]
    for r in fleet_run:
        assert 1 <= r.input_tokens <= tenants[r.tenant].max_input
        assert 0 <= r.output_tokens <= tenants[r.tenant].max_output


def test_errors_and_timeouts_are_rare_but_present(fleet_run: list[SimRequest]) -> None:
    n = len(fleet_run)
    errors = sum(r.status == "error" for r in fleet_run)
    timeouts = sum(r.status == "timeout" for r in fleet_run)
    assert 0 < errors < 0.01 * n
    assert 0 < timeouts < 0.01 * n
    for r in fleet_run:
        if r.status == "timeout":
            assert r.end_s == pytest.approx(r.arrival_s + r.deadline_s, abs=1e-9)


def test_an_incident_changes_only_the_requests_it_targets() -> None:
    cfg = default_config()
    cfg = replace(cfg, tenants=tuple(replace(t, max_concurrency=10_000) for t in cfg.tenants))
    clean = simulate(cfg, seed=1)
    slow = simulate(BY_NAME["slow_replica"].inject(cfg, 300.0, 480.0), seed=1)
    assert len(clean) == len(slow)
    changed = {b.replica for a, b in zip(clean, slow, strict=True) if a != b}
    assert changed == {"replica-07"}


# --- the catalogue --------------------------------------------------------------------------


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    pos = (len(xs) - 1) * q
    lo = math.floor(pos)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (pos - lo)


@pytest.mark.parametrize("name", [i.name for i in CATALOGUE if i.stage is not None])
def test_each_incident_raises_p99_a_lot_while_p50_holds(name: str) -> None:
    scenario = run(name, seed=1)
    clean = run("clean", seed=1).requests
    t0, t1 = scenario.window_s

    def window(reqs: list[SimRequest]) -> list[float]:  # the incident's own latency: e2e, or ttft for a prefill one
        if scenario.incident.metric == "ttft":
            return [r.first_token_s - r.arrival_s for r in reqs if t0 <= r.arrival_s < t1 and r.first_token_s < r.end_s]
        return [r.e2e_s for r in reqs if t0 <= r.arrival_s < t1]

    before, after = window(clean), window(scenario.requests)
    assert _quantile(after, 0.99) >= 1.5 * _quantile(before, 0.99)
    assert abs(_quantile(after, 0.5) / _quantile(before, 0.5) - 1) <= 0.05


@pytest.mark.parametrize("name", [i.name for i in CATALOGUE])
def test_committed_truth_matches_the_catalogue_and_the_simulator(name: str) -> None:
    truth = json.loads(generate.truth_path(generate.INCIDENTS_DIR, name).read_text())
    inc = BY_NAME[name]
    scenario = run(name, seed=truth["seed"], duration_s=truth["duration_s"])
    assert truth["requests"] == len(scenario.requests)
    assert truth["spike"] is (inc.stage is not None)
    if inc.stage is not None:
        assert (truth["stage"], truth["dimension"], truth["value"]) == (inc.stage, inc.dimension, inc.value)
        assert truth["window"]["start_ns"] == START_NS + round(scenario.window_s[0] * NS)
        assert (truth["injected"]["start_s"], truth["injected"]["end_s"]) == scenario.window_s
        after = truth["aftermath"]  # the window: the injection and the windows of its measured aftermath
        assert truth["window"]["end_s"] == scenario.window_s[1] + after["window_s"] * len(after["windows"])
        assert {"dimension": inc.dimension, "value": inc.value} in truth["accept"]


# --- emission ---------------------------------------------------------------------------------


def _ns(t: float) -> int:
    return START_NS + round(t * NS)


def test_emitted_spans_give_back_the_simulated_stages_exactly(tmp_path: Path) -> None:
    scenario = run("cold_start", seed=3, duration_s=60.0, rate=10.0)
    reqs = scenario.requests
    assert any(r.load_end_s is not None for r in reqs)
    path = write_otlp(tmp_path / "s.otlp.jsonl.gz", scenario.config, reqs, seed=3)
    store = init_store(tmp_path / "store")
    ingest_files([path], store)
    con = connect(store)
    rows = con.execute("""
        SELECT start_ns, e2e_ns, status, replica, tenant, model_version, input_tokens, output_tokens,
               streaming, network_ns, queue_wait_ns, preprocess_ns, model_load_ns, prefill_ns, decode_ns,
               streaming_ns, other_ns, ttft_ns
        FROM requests ORDER BY start_ns, trace_id""").fetchall()
    assert len(rows) == len(reqs)
    got = {(row[0], row[3], row[6]): row for row in rows}
    for r in reqs:
        row = got[(_ns(r.arrival_s), r.replica, r.input_tokens)]
        assert row[1] == _ns(r.end_s) - _ns(r.arrival_s)
        assert row[2:9] == (r.status, r.replica, r.tenant, r.version, r.input_tokens, r.output_tokens,
                            r.streaming)
        if r.error_type == "InvalidRequestError":
            continue
        assert row[9] == _ns(r.at_replica_s) - _ns(r.routed_s)
        assert row[11] == _ns(r.pre_end_s) - _ns(r.arrival_s)
        if r.status != "ok":
            continue
        load = r.load_end_s if r.load_end_s is not None else r.at_replica_s
        assert row[10] == (_ns(r.routed_s) - _ns(r.pre_end_s)) + (_ns(r.gen_start_s) - _ns(load))
        assert row[12] == _ns(load) - _ns(r.at_replica_s)
        assert row[13] == _ns(r.first_token_s) - _ns(r.gen_start_s)
        assert row[14] == _ns(r.decode_end_s) - _ns(r.first_token_s)
        tail = _ns(r.end_s) - _ns(r.decode_end_s)
        assert (row[15], row[16]) == ((tail, 0) if r.streaming else (0, tail))
        assert row[17] == _ns(r.first_token_s) - _ns(r.arrival_s)
    kinds = con.execute("""SELECT SpanKind, IsRequest, count(*) FROM spans GROUP BY ALL ORDER BY ALL""").fetchall()
    assert kinds == [("Internal", False, one(con, "SELECT count(*) FROM spans WHERE Stage IS NOT NULL")[0]),
                     ("Server", True, len(reqs))]
    nested = con.execute("""
        SELECT count(*) FROM spans c JOIN spans p ON c.TraceId = p.TraceId AND c.ParentSpanId = p.SpanId
        WHERE c.Stage IN ('prefill', 'decode') AND p.Stage <> 'generation'""").fetchone()
    assert nested == (0,)
    scopes = con.execute("SELECT DISTINCT ScopeName, ResourceAttributes['service.instance.id'] = Replica "
                         "FROM spans").fetchall()
    assert scopes == [("tailscope", True)]
    con.close()
