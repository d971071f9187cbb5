"""The accuracy suite's rules and runs on any seed: a catalogue entry simulated and written straight to a store
(`sample_traces.emit.write_store`: the rows OTLP + ingest would store, without the round trip, which
test_accuracy.py and test_committed_samples.py cover on seed 1), reported, and judged by one rule for all.

The rules (test_accuracy.py's docstring says why): a spike whose start and end each lie within one report
window of the truth window's and none outside it; the truth stage first; a first dimension the truth accepts;
no spike on runs where nothing is a tail spike (the clean run, a fleet-wide slowdown, a pure load increase).
The quarter-sampling check (test_sampling_accuracy.py's docstring) runs the same rules on a 25 % consistent
sample of a longer run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from analysis import connect
from analysis.contract import Report
from analysis.report import build_report
from analysis.stats.spikes import MIN_RISE, P50_TOLERANCE
from sample_traces import generate
from sample_traces.emit import write_store
from sample_traces.fleet import SimRequest, Throttle, default_config, simulate
from sample_traces.incidents import CATALOGUE, WINDOW_SHARE, clean_run, effect, run
from tests import samples_cache
from tests.sample_traces import sampled_copy as C
from tests.sample_traces.cli_checks import ns_of

#: The seeds every accuracy claim holds on (seed 1 is also the committed samples').
SEEDS = (1, 2, 3, 4, 5)
NAMES = [inc.name for inc in CATALOGUE]
INCIDENTS = [inc.name for inc in CATALOGUE if inc.stage is not None]
#: The incidents looked for at a quarter: those of the end-to-end latency. The prefix-cache flush (a ttft incident)
#: is not among them: in a 2,500 s run tenant cyberdyne's non-streaming batch requests queue behind its concurrency
#: limit of 2 for up to 14 s in every 300 s window of the clean run, so they hold the ttft tail, and at a quarter
#: the report names `gen_ai.request.stream = false` and ends the spike more than a window after the truth's.
QUARTER_INCIDENTS = [inc.name for inc in CATALOGUE if inc.stage is not None and inc.metric == "e2e"]
#: Runs with no tail spike, simulated here (p50 and p99 rise together; twice the requests from the same law).
NEGATIVE = ("fleet_slowdown", "load_increase")
#: Length of the runs sampled at 25 %: a p99 is judged only on windows with 500 effective values (the
#: low-sample rule), and a quarter of 10 requests/s gives 150 per minute; at 2,500 s the automatic 300 s
#: windows hold about 750.
QUARTER_RUN_S = 2500.0
#: The keep probability of the quarter-sampled runs, and the tracestate a consistent sampler at it records.
QUARTER = 0.25
QUARTER_STATE = f"ot=th:{C.th_text(C.threshold(QUARTER))}"
#: (incident, seed) the report does not get right with these rules, and why (measured; test_accuracy.py's
#: docstring). The tests of these are expected to fail, strictly: one that passes fails the run. None now.
KNOWN_MISSES: dict[tuple[str, int], str] = {}


#: The same for the quarter-sampled runs (2,500 s, 300 s windows, seeds 2-5; measured). The cold start's are the
#: sample's limit (docs/demo.md, `python -m tests.sample_traces.quarter_power`): over 60 seeds a quarter lifts the
#: 90 s event's window p99 by 20 % on about two thirds of them, at full rate on every one. docs/methods.md ("A short
#: event under sampling") measures three routes around it that were not taken (stage scans, shorter windows, weights).
KNOWN_QUARTER_MISSES: dict[tuple[str, int], str] = {
    ("cold_start", 3): "no spike: 7 cold-start requests kept in 14:20-14:25, 4 of them above every other value (the "
                       "run's 1st, 2nd, 3rd and 6th slowest), and 4 on top of 750 values lift a p99 by 17-21 % with "
                       "the clean runs' law (quarter_power --lift): its p99 is 21.9 s against the "
                       "baseline's 18.7 s (+17 %, under the 20 % rise) and it holds 11 values above the scan's "
                       "threshold where 7.9 are expected (scan p = 0.26). A p99 is judged on 500 values (MIN_TAIL), "
                       "200 s of the 2.5 kept requests/s, so the 90 s event is at most half of any judged window",
    ("cold_start", 4): "no spike: 14:20-14:25 is a candidate (p99 24.6 s against 18.6 s) with the run's 3 slowest "
                       "requests (cold starts), but its 11 values above the scan's threshold (7.5 expected) give "
                       "p = 0.039, above ALPHA; no judged window is shorter than 200 s (as seed 3)",
}


def known_miss(name: str, seed: int, misses: dict[tuple[str, int], str] = KNOWN_MISSES) -> Any:
    """`name` as a parameter, marked xfail (strict) when it is a known miss on `seed` (in `misses`)."""
    reason = misses.get((name, seed))
    return pytest.param(name, marks=pytest.mark.xfail(reason=reason, strict=True)) if reason else name


def overlaps(spike: Mapping[str, Any], window: dict[str, Any]) -> bool:
    """Whether the spike and the truth window overlap."""
    return ns_of(spike["start"]) < window["end_ns"] and ns_of(spike["end"]) > window["start_ns"]


def bounds_hold(spike: Mapping[str, Any], window: dict[str, Any], window_s: float) -> bool:
    """The spike's start and end each within one report window of the truth window's."""
    slack = round(window_s * 1_000_000_000)
    return (abs(ns_of(spike["start"]) - window["start_ns"]) <= slack
            and abs(ns_of(spike["end"]) - window["end_ns"]) <= slack)


def accepted(dim: Mapping[str, Any], accept: list[dict[str, Any]]) -> bool:
    """Whether a report dimension is one the truth accepts (the value, or a bucket from `lo_min` up)."""
    for a in accept:
        if dim["dimension"] != a["dimension"]:
            continue
        if "value" in a and dim["value"] == a["value"]:
            return True
        if "lo_min" in a and dim.get("lo") is not None and dim["lo"] >= a["lo_min"]:
            return True
    return False


def summary(report: Mapping[str, Any]) -> str:
    """The report's spikes in one line (for failure messages)."""
    parts = []
    for s in report["spikes"]:
        stages = [st["stage"] for st in s["stages"][:2]]
        dims = [f"{d['dimension']}={d['value']}" for d in s["dimensions"][:2]]
        parts.append(f"{s['start']}..{s['end']} p99 {s['p99_ms']} ms (baseline {s['baseline_p99_ms']}) "
                     f"stages {stages} dims {dims}")
    return "; ".join(parts) or f"no spike (errors: {report.get('errors')})"


def check_found(name: str, report: Mapping[str, Any], t: dict[str, Any]) -> None:
    """The rules for an incident: its window (bounds within one report window, nothing outside), its stage first,
    an accepted dimension first."""
    spikes = report["spikes"]
    assert spikes, f"{name}: {summary(report)}; truth {t['window']}"
    assert overlaps(spikes[0], t["window"]) and bounds_hold(spikes[0], t["window"], report["window_s"]), \
        f"{name}: bounds more than {report['window_s']} s off: {summary(report)}; truth {t['window']}"
    outside = [s for s in spikes if not overlaps(s, t["window"])]
    assert outside == [], f"{name}: spikes outside the truth window: {summary(report)}"
    assert spikes[0]["stages"][0]["stage"] == t["stage"], f"{name}: {summary(report)}"
    dims = spikes[0]["dimensions"]
    assert dims and accepted(dims[0], t["accept"]), f"{name}: {summary(report)}; truth accepts {t['accept']}"


def report_of(store: Path, metric: str = "e2e") -> Report:
    """The report (`build_report`, the defaults `tailscope report` uses) of a store, on `metric`."""
    con = connect(store)
    try:
        return build_report(con, metric)
    finally:
        con.close()


def check_catalogue_entry(name: str, seed: int, factory: pytest.TempPathFactory) -> None:
    """Simulate a catalogue entry on `seed` (10 minutes at 10 requests/s, as the committed samples), report it,
    and judge it: the incident's rules, or no spike for the clean run. The store is the session's
    (`samples_cache.seeded_store`: the same simulation written the same way, shared with test_clickhouse.py)."""
    scenario = run(name, seed, generate.DURATION_S, generate.RATE)
    report = report_of(samples_cache.seeded_store(name, seed, factory, scenario), scenario.incident.metric)
    assert report["requests"] == len(scenario.requests)
    if scenario.incident.stage is None:
        assert report["spikes"] == [], f"{name} seed {seed}: {summary(report)}"
    else:
        check_found(f"{name} seed {seed}", report, scenario.truth())


def check_negative(case: str, seed: int, tmp_path: Path) -> None:
    """A run with no tail spike on `seed` reports none; its premise (p50 and p99 both rose by more than the rules'
    10 % and 20 %, or twice the requests) is checked against the clean run."""
    cfg = default_config(generate.DURATION_S, generate.RATE)
    t0, t1 = WINDOW_SHARE[0] * cfg.duration_s, WINDOW_SHARE[1] * cfg.duration_s
    clean = clean_run(cfg, seed)
    store = tmp_path / "store"
    if case == "fleet_slowdown":  # every replica 1.5x slower in [t0, t1)
        slow = replace(cfg, throttles=tuple(Throttle(r.name, t0, t1, factor=1.5) for r in cfg.replicas))
        reqs: list[SimRequest] = simulate(slow, seed)
        write_store(store, slow, reqs, seed)
    else:  # load_increase: a second fleet, the same in all but its replicas' names, adds its traffic in [t0, t1)
        twin = replace(cfg, replicas=tuple(replace(r, name=r.name.replace("replica-", "replica-b"))
                                           for r in cfg.replicas))
        extra = [r for r in simulate(twin, seed + 1) if t0 <= r.arrival_s < t1]
        reqs = clean + extra
        write_store(store, cfg, clean, seed)
        write_store(store, twin, extra, seed + 1)
    eff = effect(reqs, clean, t0, t1)
    if case == "fleet_slowdown":  # both rose by more than the rules' limits: the p99 alone would be a candidate
        assert eff["incident"]["p50_ms"] > (1 + P50_TOLERANCE) * eff["clean"]["p50_ms"], eff
        assert eff["incident"]["p99_ms"] > (1 + MIN_RISE) * eff["clean"]["p99_ms"], eff
    else:
        assert eff["incident"]["requests"] > 1.9 * eff["clean"]["requests"], eff
    report = report_of(store)
    assert report["spikes"] == [], f"{case} seed {seed}: {summary(report)}"


def quarter_copy(scenario: Any, seed: int, tmp_path: Path) -> Path:
    """The store of a 25 % consistent sample of the scenario's traces, `ot=th` recorded: only the traces the rule
    keeps (`C.keeps`, by the trace id's randomness) are written, each span with the threshold's tracestate
    (test_emit_columns.py checks these are the rows `C.consistent_sample` keeps of the whole store)."""
    return write_store(tmp_path / "copy", scenario.config, scenario.requests, seed, keep=C.keeps(QUARTER),
                       trace_state=QUARTER_STATE)


def check_quarter(name: str, seed: int, tmp_path: Path) -> None:
    """The incident is still found, by the same rules, in a 25 % sample of a QUARTER_RUN_S run on `seed`, and every
    kept count stands beside what it stands for."""
    scenario = run(name, seed, QUARTER_RUN_S, generate.RATE)
    t = scenario.truth()  # window (the injection and its aftermath against the clean run), stage, accepted dimensions
    report = report_of(quarter_copy(scenario, seed, tmp_path), scenario.incident.metric)
    assert report["sampled"] and report["warnings"] == [], report["warnings"]
    check_found(f"{name} seed {seed} at a quarter", report, t)
    spike = report["spikes"][0]
    # beside every kept count, what it stands for (a quarter: about 4 times as many) and its effective count
    effective = spike.get("tail_effective")
    assert effective is not None and effective <= spike["tail_requests"] < spike["tail_requests_weighted"]
    assert all(d["support"] < d["support_weighted"] <= spike["tail_requests_weighted"] + 1e-6
               for d in spike["dimensions"])


Test = Callable[..., None]


def seed_tests(seed: int) -> tuple[Test, Test, Test]:
    """The three tests of one seed's file (one file per seed, so `pytest -n auto --dist loadfile` spreads them):
    every catalogue entry judged, no spike where nothing is a tail spike, every incident found at a quarter."""

    @pytest.mark.parametrize("name", [known_miss(n, seed) for n in NAMES])
    def test_every_catalogue_entry_is_judged_right(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
        check_catalogue_entry(name, seed, tmp_path_factory)

    @pytest.mark.parametrize("case", NEGATIVE)
    def test_no_spike_where_nothing_is_a_tail_spike(case: str, tmp_path: Path) -> None:
        check_negative(case, seed, tmp_path)

    @pytest.mark.parametrize("name", [known_miss(n, seed, KNOWN_QUARTER_MISSES) for n in QUARTER_INCIDENTS])
    def test_every_incident_is_still_found_at_a_quarter(name: str, tmp_path: Path) -> None:
        check_quarter(name, seed, tmp_path)

    return (test_every_catalogue_entry_is_judged_right, test_no_spike_where_nothing_is_a_tail_spike,
            test_every_incident_is_still_found_at_a_quarter)
