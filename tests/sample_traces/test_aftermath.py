"""The truth's aftermath (`sample_traces.incidents.aftermath`): the minutes after an injection that are still the
incident's, measured against the same seed's run without it, checked against a plain reference on random runs and
on the catalogue's known cases."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from analysis.stats.spikes import MIN_RISE
from sample_traces.fleet import FleetConfig, SimRequest, default_config, simulate
from sample_traces.incidents import (
    AFTERMATH_RISE,
    AFTERMATH_WINDOW_S,
    BY_NAME,
    CATALOGUE,
    Incident,
    aftermath,
    clean_run,
    named_by,
    run,
)


def test_the_rise_is_the_one_the_analysis_calls_a_spike() -> None:
    assert AFTERMATH_RISE == MIN_RISE


def test_every_incident_names_requests_of_its_own_run() -> None:
    for inc in CATALOGUE:
        if inc.stage is None:
            continue
        scenario = run(inc.name, seed=1, duration_s=600.0, rate=2.0)
        named = named_by(inc, scenario.config)
        t0, t1 = scenario.window_s
        assert any(named(r) for r in scenario.requests if t0 <= r.arrival_s < t1), inc.name


def _request(i: int, arrival: float, latency: float, tenant: str, cached: int) -> SimRequest:
    r = SimRequest(index=i, tenant=tenant, arrival_s=arrival, input_tokens=1, output_tokens=1, streaming=False,
                   client_tps=1.0, route_u=0.0, hop_s=0.0, error_u=1.0, error_frac=0.0, deadline_s=1e9)
    r.cached_tokens = cached
    r.first_token_s = arrival + latency / 3
    r.end_s = arrival + latency
    return r


def _reference(inc: Incident, reqs: list[SimRequest], clean: list[SimRequest], end_s: float, duration_s: float
               ) -> list[tuple[float, float]]:
    """The rule written out plainly: per window, the named requests' own latencies and every other request's twin's
    (by arrival), their p99 (numpy's linear percentile) against the clean run's, while it rose by more than 20 %."""
    named = {"tenant": lambda r: r.tenant == inc.value,
             "gen_ai.usage.cache_read.input_tokens": lambda r: r.cached_tokens == 0}[inc.dimension or ""]

    def lat(r: SimRequest) -> float | None:
        if inc.metric == "ttft":
            return (r.first_token_s - r.arrival_s) * 1000 if r.first_token_s < r.end_s else None
        return (r.end_s - r.arrival_s) * 1000

    twin = {r.arrival_s: r for r in clean}
    out = []
    for k in range(int((duration_s - end_s) // AFTERMATH_WINDOW_S)):
        a, b = end_s + k * AFTERMATH_WINDOW_S, end_s + (k + 1) * AFTERMATH_WINDOW_S
        mixed = [lat(r if named(r) else twin[r.arrival_s]) for r in reqs if a <= r.arrival_s < b]
        base = [lat(r) for r in clean if a <= r.arrival_s < b]
        ours = float(np.percentile([v for v in mixed if v is not None], 99))
        theirs = float(np.percentile([v for v in base if v is not None], 99))
        if ours <= 1.2 * theirs:
            break
        out.append((round(ours, 1), round(theirs, 1)))
    return out


@pytest.mark.parametrize("name", ["queue_backlog", "prefix_cache_flush"])
def test_the_aftermath_is_the_plain_rule_on_random_runs(name: str) -> None:
    inc = BY_NAME[name]
    cfg = default_config(duration_s=600.0)
    rng = random.Random(name)
    for _ in range(100):
        end_s = rng.choice((240.0, 300.0, 450.0))
        clean = []
        for i in range(rng.randint(300, 900)):
            tenant = "cyberdyne" if rng.random() < 0.1 else "acme"
            clean.append(_request(i, rng.uniform(0.0, 600.0), rng.lognormvariate(8.0, 0.6), tenant,
                                  0 if rng.random() < 0.4 else 64))
        clean.sort(key=lambda r: r.arrival_s)
        # the incident run: the same requests, some slower (named or not) for a random number of windows after the
        # injection, a few no faster, plus extra named requests (a burst's) with no twin
        lasting = end_s + AFTERMATH_WINDOW_S * rng.randint(0, 4)
        reqs = []
        for r in clean:
            c = replace(r)
            if end_s <= r.arrival_s < lasting and rng.random() < 0.3:
                factor = rng.uniform(1.0, 6.0)
                c.first_token_s = r.arrival_s + (r.first_token_s - r.arrival_s) * factor
                c.end_s = r.arrival_s + (r.end_s - r.arrival_s) * factor
            reqs.append(c)
        for i in range(rng.randint(0, 20)):
            reqs.append(_request(10_000 + i, rng.uniform(end_s, 600.0), rng.lognormvariate(9.0, 0.5), "cyberdyne", 0))
        reqs.sort(key=lambda r: r.arrival_s)
        got = aftermath(inc, cfg, reqs, clean, end_s)
        want = _reference(inc, reqs, clean, end_s, 600.0)
        assert [(w["incident_p99_ms"], w["clean_p99_ms"]) for w in got["windows"]] == want
        assert got["stopped"] is None or len(want) < int((600.0 - end_s) // AFTERMATH_WINDOW_S)


def _all_p99(reqs: list[SimRequest], a: float, b: float) -> float:
    return float(np.percentile([r.e2e_s for r in reqs if a <= r.arrival_s < b], 99))


def test_the_queue_backlog_on_seed_2_lasts_two_minutes_past_the_bursts() -> None:
    scenario = run("queue_backlog", seed=2)
    truth = scenario.truth()
    assert truth["injected"]["end"] == "2025-11-20T14:08:00Z" and truth["window"]["end"] == "2025-11-20T14:10:00Z"
    assert truth["aftermath"]["windows"] == [{"incident_p99_ms": 35021.7, "clean_p99_ms": 16311.1},
                                             {"incident_p99_ms": 42980.1, "clean_p99_ms": 22258.3}]
    assert truth["aftermath"]["stopped"] is None  # the run ends at 14:10


def test_a_knock_on_on_other_requests_is_not_the_incidents_aftermath() -> None:
    # seed 2: preempted batch-priority requests of tenant cyberdyne hold its two gateway slots, so its other requests
    # queue after the injection: the window's p99 rose, but not by the requests the incident names
    scenario = run("priority_preemption", seed=2)
    clean = clean_run(scenario.clean_config or FleetConfig(), 2)
    assert _all_p99(scenario.requests, 480.0, 540.0) > 1.5 * _all_p99(clean, 480.0, 540.0)
    truth = scenario.truth()
    assert truth["aftermath"]["windows"] == [] and truth["window"] == truth["injected"]


def test_bursts_draw_from_their_own_stream_so_the_other_requests_keep_theirs() -> None:
    cfg = default_config()
    clean = simulate(cfg, seed=3)
    burst = simulate(BY_NAME["queue_backlog"].inject(cfg, 300.0, 480.0), seed=3)
    twins = {r.arrival_s: r for r in burst}
    assert len(burst) == len(clean) + 12 * 3
    fields = ("tenant", "input_tokens", "streaming", "client_tps", "route_u", "hop_s", "error_u", "priority",
              "lora_adapter", "cached_tokens")
    for r in clean:
        twin = twins[r.arrival_s]
        assert [getattr(r, f) for f in fields] == [getattr(twin, f) for f in fields]
        if r.status == twin.status == "ok":  # (a timeout keeps the tokens made by its deadline)
            assert r.output_tokens == twin.output_tokens
    arrivals = {c.arrival_s for c in clean}
    extra = [r for r in burst if r.arrival_s not in arrivals]
    assert len(extra) == 36 and {r.tenant for r in extra} == {"cyberdyne"}
