"""`tailscope watch`: replay over the incident catalogue, the fleet-wide slowdown, rules, live == replay, restarts.

Every catalogue sample (sample_traces/data/incidents/) is ingested into its own store and
replayed with the command's defaults (60 s windows, evaluated 60 s after they close). Each
incident must fire exactly one tail-spike alert on one of the first two windows of its
truth window and resolve on one of the two windows after it ends, carrying the truth stage
and an accepted dimension value; the clean run fires nothing. A fleet-wide slowdown (every
replica throttled: p50 moves too) must fire the SLO rule and never the tail-spike alert.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from analysis.watch import (
    AlertStore,
    Config,
    Event,
    LiveWatch,
    Rule,
    evaluate_rule,
    list_alerts,
    parse_rule,
    parse_rules,
    replay,
)
from intake.ingest import ingest_files
from sample_traces import generate
from sample_traces.emit import write_otlp
from sample_traces.fleet import START_NS, Throttle, default_config, simulate
from sample_traces.incidents import CATALOGUE
from tailscope.cli import app
from tests import samples_cache
from tests.sample_traces.seeded import accepted
from tests.sample_traces.test_accuracy import truth
from tracing.errors import QueryError

runner = CliRunner()
NS = 1_000_000_000
W = 60 * NS  # the command's default window ...
DELAY = 60 * NS  # ... and delay
INCIDENTS = [inc.name for inc in CATALOGUE if inc.stage is not None]


def store_of(name: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample ingested by `tailscope ingest` (once per worker, shared with test_accuracy); read only."""
    return samples_cache.store(generate.traces_path(generate.INCIDENTS_DIR, name), tmp_path_factory, cli=True)


def replay_json(store: Path, *extra: str) -> list[dict[str, Any]]:
    result = runner.invoke(app, ["watch", "--replay", "--json", "--store", str(store), *extra])
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def _ns(text: str) -> int:
    from analysis.engine.percentiles import parse_time
    value = parse_time(text)
    assert value is not None
    return value


# --- the catalogue ------------------------------------------------------------------------------

def test_the_clean_run_fires_nothing(tmp_path_factory: pytest.TempPathFactory) -> None:
    assert replay_json(store_of("clean", tmp_path_factory)) == []


@pytest.mark.slow
@pytest.mark.parametrize("name", INCIDENTS)
def test_each_incident_fires_once_early_and_resolves_soon_after(name: str,
                                                                tmp_path_factory: pytest.TempPathFactory) -> None:
    t = truth(name)
    alerts = replay_json(store_of(name, tmp_path_factory), "--metric", t.get("metric", "e2e"))  # the incident's
    assert [a["kind"] for a in alerts] == ["tail_spike"], alerts
    a = alerts[0]
    start, end = t["window"]["start_ns"], t["window"]["end_ns"]
    fired_window_end = _ns(a["fired_at"]) - DELAY  # the window whose evaluation fired it
    resolved_window_end = _ns(a["resolved_at"]) - DELAY
    assert start < fired_window_end <= start + 2 * W, (a["fired_at"], t["window"])
    assert end < resolved_window_end <= end + 2 * W, (a["resolved_at"], t["window"])
    assert _ns(a["window_start"]) >= start - W
    assert a["stage"] == t["stage"], a["stages"]
    assert accepted({"dimension": a["dimension"], "value": a["value"], "lo": a["dimensions"][0]["lo"]},
                     t["accept"]), a["dimensions"][:2]
    assert a["p99_ms"] > a["baseline_p99_ms"] * 1.2 and len(a["exemplars"]) >= 1
    for key in ("rule", "metric", "p50_ms", "window_end", "explained"):
        assert key in a


@pytest.fixture(scope="module")
def fleet_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every replica computes 2x slower during [300 s, 480 s): the whole distribution moves, p50 included."""
    cfg = default_config(600.0, 10.0)
    cfg = replace(cfg, throttles=tuple(Throttle(r.name, 300.0, 480.0, 2.0) for r in cfg.replicas))
    root = tmp_path_factory.mktemp("fleet")
    traces = write_otlp(root / "fleet.otlp.jsonl.gz", cfg, simulate(cfg, 1), 1)
    ingest_files([traces], root / "store")
    return root / "store"


@pytest.mark.slow
def test_a_fleet_wide_slowdown_fires_the_slo_rule_not_the_tail_spike(fleet_store: Path, tmp_path: Path) -> None:
    rules = tmp_path / "rules.txt"
    rules.write_text("# fleet SLO\np99(e2e) < 25s\np99(e2e) < 25s for tenant=nobody\n")
    alerts = replay_json(fleet_store, "--rules", str(rules))
    assert [(a["kind"], a["rule"]) for a in alerts] == [("slo", "p99(e2e) < 25s")], alerts
    a = alerts[0]
    start, end = START_NS + 300 * NS, START_NS + 480 * NS
    assert start < _ns(a["fired_at"]) - DELAY <= start + 2 * W
    assert end < _ns(a["resolved_at"]) - DELAY <= end + 2 * W
    assert a["measured_ms"] >= 25_000 and a["threshold_ms"] == 25_000
    assert sum(a["outcomes"].values()) == a["requests"]


# --- rules --------------------------------------------------------------------------------------

def test_rules_parse_to_exact_settings() -> None:
    r = parse_rule("p99(ttft) < 2s")
    assert (r.kind, r.metric, r.q, r.threshold_ns, r.where) == ("percentile", "ttft", 0.99, 2e9, ())
    r = parse_rule("p99.9(e2e) < 20s for tenant=acme, replica=r-1   # comment")
    assert (r.q, r.threshold_ns, r.where) == (pytest.approx(0.999), 20e9, (("tenant", "acme"), ("replica", "r-1")))
    r = parse_rule("error_rate < 0.5%")
    assert (r.kind, r.threshold_ratio) == ("error_rate", 0.005)
    r = parse_rule("burn(e2e < 20s, 99.9%) > 14.4 over 5m, 1h")
    assert (r.kind, r.metric, r.threshold_ns, r.objective, r.rate, r.fast_s, r.slow_s) == (
        "burn", "e2e", 20e9, pytest.approx(0.999), 14.4, 300.0, 3600.0)


@pytest.mark.parametrize(("text", "needle"), [
    ("p99(latency) < 2s", "cannot read rule"),
    ("p99(e2e) < 2 parsecs", "cannot read rule"),
    ("p99(e2e) < 2s for colour=red", "cannot read filter"),
    ("burn(e2e < 2s, 100%) > 2 over 5m, 1h", "objective"),
    ("burn(e2e < 2s, 99%) > 2 over 1h, 5m", "fast span"),
])
def test_bad_rules_say_which_line(text: str, needle: str) -> None:
    with pytest.raises(QueryError) as err:
        parse_rules(f"# ok\np99(e2e) < 1s\n{text}\n", "rules.txt")
    assert str(err.value).startswith("rules.txt:3: ") and needle in str(err.value)


def test_a_bad_rules_file_is_one_line_on_the_command_line(tmp_path: Path,
                                                          tmp_path_factory: pytest.TempPathFactory) -> None:
    rules = tmp_path / "rules.txt"
    rules.write_text("p99(e2e) <\n")
    result = runner.invoke(app, ["watch", "--replay", "--store", str(store_of("clean", tmp_path_factory)),
                                 "--rules", str(rules)])
    assert result.exit_code == 1 and "rules.txt:1: cannot read rule" in result.output
    assert "Traceback" not in result.output


def _frame(rng: random.Random, n: int, win_ns: int, window_ns: int) -> pl.DataFrame:
    statuses = ["ok"] * 8 + ["error", "timeout"]
    starts = [win_ns - rng.randrange(3) * window_ns + rng.randrange(window_ns) for _ in range(n)]
    return pl.DataFrame({
        "start_ns": starts,
        "e2e_ns": [rng.choice([None, *(rng.randrange(1, 10**10) for _ in range(9))]) for _ in range(n)],
        "status": [rng.choice(statuses) for _ in range(n)],
    }, schema={"start_ns": pl.Int64, "e2e_ns": pl.Int64, "status": pl.String})


def test_percentile_rules_match_duckdb_quantile_cont_on_random_windows() -> None:
    rng = random.Random(5)
    con = duckdb.connect()
    window_ns = 10 * NS
    for trial in range(300):
        frame = _frame(rng, rng.randrange(1, 60), 50 * window_ns, window_ns)
        q = rng.choice([0.5, 0.9, 0.99, 0.999])
        rule = Rule("t", "percentile", metric="e2e", q=q, threshold_ns=rng.randrange(1, 10**10))
        got = evaluate_rule(rule, frame, 50 * window_ns, window_ns)
        con.register("f", frame.to_arrow())
        ref = con.execute("SELECT quantile_cont(e2e_ns, ?) FROM f WHERE start_ns >= ? AND start_ns < ?",
                          [q, 50 * window_ns, 51 * window_ns]).fetchall()[0][0]
        if ref is None:
            assert got is None, trial
            continue
        assert got is not None
        assert got[0] == (ref >= rule.threshold_ns), trial
        assert got[1]["measured_ms"] == round(ref / 1e6, 3), trial


def test_burn_rates_match_a_plain_count_on_random_windows() -> None:
    rng = random.Random(9)
    window_ns = 10 * NS
    win = 50 * window_ns
    for trial in range(300):
        frame = _frame(rng, rng.randrange(1, 80), win, window_ns)
        rule = Rule("t", "burn", metric="e2e", threshold_ns=rng.randrange(1, 10**10), objective=0.95,
                    rate=rng.choice([0.5, 2.0, 5.0]), fast_s=10.0, slow_s=30.0)
        got = evaluate_rule(rule, frame, win, window_ns)
        rates = []
        for span in (1, 3):
            rows = [r for r in frame.iter_rows(named=True) if win - (span - 1) * window_ns <= r["start_ns"] < win +
                    window_ns and (r["e2e_ns"] is not None or r["status"] != "ok")]
            bad = [r for r in rows if r["status"] != "ok" or r["e2e_ns"] >= rule.threshold_ns]
            rates.append(len(bad) / len(rows) / 0.05 if rows else math.nan)
        if any(math.isnan(r) for r in rates):
            assert got is None, trial
            continue
        assert got is not None
        assert got[0] == all(r > rule.rate for r in rates), trial
        assert (got[1]["burn_fast"], got[1]["burn_slow"]) == (round(rates[0], 4), round(rates[1], 4)), trial


# --- live == replay, and restarts ------------------------------------------------------------------

def _live(store: Path, cfg: Config, now_ns: int, kill_at_ns: int | None = None) -> list[Event]:
    """Step a LiveWatch over the stored data on a simulated clock; with kill_at_ns, start a new one there."""
    events: list[Event] = []
    live = LiveWatch(store, cfg, events.append)
    t = now_ns
    while t < START_NS + 720 * NS:
        if kill_at_ns is not None and t >= kill_at_ns:
            live = LiveWatch(store, cfg, events.append)  # as after kill -9: only the files on disk carry over
            kill_at_ns = None
        live.step(t)
        t += 7 * NS
    return events


def test_live_on_a_clock_fires_what_replay_fires_and_survives_a_restart(tmp_path_factory: pytest.TempPathFactory,
                                                                         tmp_path: Path) -> None:
    import shutil
    src = store_of("slow_replica", tmp_path_factory)
    cfg = Config()
    replayed = replay(src, cfg, START_NS, START_NS + 600 * NS)
    for name, kill in (("straight", None), ("restarted", START_NS + 440 * NS)):
        store = tmp_path / name
        shutil.copytree(src, store)
        events = _live(store, cfg, START_NS + 2 * 60 * NS, kill)
        assert [(e.status, e.alert["id"]) for e in events] == [
            ("firing", replayed[0]["id"]), ("resolved", replayed[0]["id"])], name
        final = events[-1].alert
        assert {k: final[k] for k in ("fired_at", "resolved_at", "window_start", "window_end", "stage", "value")} == \
            {k: replayed[0][k] for k in ("fired_at", "resolved_at", "window_start", "window_end", "stage", "value")}
        kept = list_alerts(store)
        assert [(a["id"], a["status"]) for a in kept] == [(replayed[0]["id"], "resolved")]
        state = AlertStore(store).load_state()
        # the last step, at 715 s, could evaluate the windows ending by 715 - 60 s: up to 600 s
        assert state["active"] == {} and state["last_window_end_ns"] == START_NS + 600 * NS


def test_replay_text_names_the_cause(tmp_path_factory: pytest.TempPathFactory) -> None:
    result = runner.invoke(app, ["watch", "--replay", "--store", str(store_of("slow_replica", tmp_path_factory)),
                                 "--dashboard-url", "http://127.0.0.1:8501/"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 2 and "FIRING tail spike of e2e" in lines[0] and "RESOLVED" in lines[1]
    assert "stage decode" in lines[0] and "replica=replica-07" in lines[0]
    assert "http://127.0.0.1:8501/spike?start_ns=1763647500000000000&end_ns=1763647560000000000" in lines[0]


def test_detect_is_the_reports(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The watch's baseline figures come from analysis.stats.spikes.detect on the buffered rows (no second detector)."""
    from analysis.stats.spikes import detect
    from analysis.watch import Watcher, open_range, read_rows
    store = store_of("slow_replica", tmp_path_factory)
    con = open_range(store, START_NS, START_NS + 900 * NS)
    rows = read_rows(con, START_NS, START_NS + 360 * NS, W, DELAY)
    w = Watcher(Config())
    for t in range(START_NS, START_NS + 300 * NS, W):
        w.add_window(t, rows.filter((pl.col("start_ns") >= t) & (pl.col("start_ns") < t + W)))
    w.tick(START_NS + 300 * NS, rows.filter(pl.col("start_ns") >= START_NS + 300 * NS))
    det = detect(rows.get_column("start_ns").to_numpy(), rows.get_column("e2e_ns").to_numpy().astype(np.float64), W)
    assert w.last_detection is not None
    assert w.last_detection.baseline_p99_ns == det.baseline_p99_ns
    assert list(w.last_detection.significant) == list(det.significant)
