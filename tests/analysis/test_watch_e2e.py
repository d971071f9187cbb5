"""End to end on loopback: example server -> OTLP -> `tailscope collect` -> store -> `tailscope watch` -> receivers.

Light load, then an incident (requests timing out on the server: 504), then light load again. `watch` (2 s windows)
must POST the SLO alert to a generic webhook, to a stand-in Alertmanager that records the exact
bodies, and to Debian's real Alertmanager, whose route sends alerts labelled team="serving" and
severity="page" (labels the rules file sets) to their own webhook, grouped by alertname and
service; it is killed with SIGKILL while the alert fires (after the fire was delivered) and
restarted, and the receivers must see exactly one fire and one resolve, with the exact payloads.
Every load loop is bounded in requests and time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from examples.loadgen import run
from tests import servers
from tests.analysis.alert_receiver import Recorder, recording
from tests.intake.collect_helpers import ROOT, start_cli_receiver
from tests.monitoring import alertmanager, get_json, need_monitoring
from tracing.client import post_json

pytestmark = pytest.mark.slow  # an end-to-end run (CONTRIBUTING.md: make test-fast leaves it out)

RULE = "error_rate < 10%"
RULE_LINE = f'{RULE} labels {{severity="page", team="serving"}} annotations {{runbook="http://127.0.0.1/rb#errors"}}'
DASH = "http://127.0.0.1:8501"
AM_CONFIG = """route:
  receiver: default
  group_by: [alertname, service]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
  routes:
    - receiver: serving
      matchers: ['team="serving"', 'severity="page"']
receivers:
  - name: default
    webhook_configs: [{url: "REC/am-default", send_resolved: true}]
  - name: serving
    webhook_configs: [{url: "REC/am-serving", send_resolved: true}]
"""


def _start_watch(store: Path, rules: Path, rec: Recorder, log: Path, am: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tailscope.cli", "watch", "--store", str(store), "--window", "2s", "--delay", "4s",
         "--lookback", "5", "--rules", str(rules), "--webhook", rec.url("/hook"), "--alertmanager", rec.url(),
         "--alertmanager", am, "--dashboard-url", DASH, "--poll", "0.5s"],
        cwd=ROOT, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
        env=dict(os.environ, PYTHONUNBUFFERED="1"))


class Load:
    """Requests in a background thread until stopped: light (loadgen) or heavy (requests that time out)."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.heavy = False
        self.stop = threading.Event()
        self.sent = 0
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        for i in range(5_000):  # bounded in count (and by the test's deadlines in time)
            if self.stop.is_set():
                return
            try:
                if self.heavy:
                    post_json(self.urls[i % 2] + "/v1/completions",  # times out on the server: 504
                              {"prompt": "w " * 16, "max_tokens": 200, "timeout_s": 0.02}, timeout=30)
                else:
                    run(self.urls, 4, concurrency=2, seed=i)
                self.sent += 1
            except Exception as exc:  # say it in the assertion message, keep loading
                self.errors.append(repr(exc))


def _wait(cond: Any, seconds: float, what: str, extra: Any = lambda: "") -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {seconds} s waiting for {what}; {extra()}")


def _dump(watch: subprocess.Popen[bytes], load: Load, log: Path) -> str:
    """What went wrong: the load's errors and the watch's log with its threads' stacks (SIGUSR1)."""
    watch.send_signal(signal.SIGUSR1)
    time.sleep(1)
    return f"load errors {load.errors[-3:]}, sent {load.sent}, {log.read_text()}"


def _statuses(rec: Recorder) -> list[str]:
    return [b["status"] for b in rec.on("/hook")]


def test_watch_alerts_real_receivers_and_survives_kill_9(tmp_path: Path) -> None:
    need_monitoring()
    store = tmp_path / "store"
    collect, port = start_cli_receiver(store)
    serve = servers.spawn(
        [sys.executable, "-m", "examples.serve", "--port", "0", "--replicas", "2", "--exporters", "otlp"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env=dict(os.environ, TAILSCOPE_OTLP_ENDPOINT=f"http://127.0.0.1:{port}/v1/traces"))
    rules = tmp_path / "rules.txt"
    rules.write_text(f"{RULE_LINE}\n")
    log = tmp_path / "watch.log"
    procs: list[subprocess.Popen[Any]] = [collect, serve]
    load: Load | None = None
    try:
        assert serve.stdout is not None
        urls = [serve.stdout.readline().split()[1] for _ in range(2)]
        with recording() as rec, alertmanager(tmp_path, AM_CONFIG.replace("REC", rec.url())) as am:
            load = Load(urls)
            load.thread.start()
            _wait(lambda: any(store.glob("spans/*/*/*.parquet")), 60, "the first segment from collect")
            watch = _start_watch(store, rules, rec, log, am)
            procs.append(watch)
            time.sleep(8)  # light load: a few windows below the threshold
            assert _statuses(rec) == [], log.read_text()
            load.heavy = True
            _wait(lambda: _statuses(rec) == ["firing"], 60, "the fire",
                  lambda: f"load errors {load.errors[-3:]}, sent {load.sent}, {log.read_text()}")
            _wait(lambda: len(list(store.glob("alerts/delivered/*/*.firing.json"))) == 3, 30,
                  "the fire marked delivered")
            _wait(lambda: rec.on("/am-serving"), 30, "Alertmanager's notification of the fire")
            groups = get_json(f"{am}/api/v2/alerts/groups")
            watch.send_signal(signal.SIGKILL)  # mid-incident
            watch.wait(timeout=30)
            time.sleep(3)
            watch = _start_watch(store, rules, rec, log, am)
            procs.append(watch)
            load.heavy = False
            _wait(lambda: _statuses(rec) == ["firing", "resolved"] and len(rec.on("/api/v2/alerts")) >= 2 and
                  "endsAt" in rec.on("/api/v2/alerts")[-1][0], 90, "the resolve",
                  lambda: _dump(watch, load, log))
            _wait(lambda: any(n["status"] == "resolved" for n in rec.on("/am-serving")), 30,
                  "Alertmanager's notification of the resolve")
            time.sleep(4)  # nothing more may come
            load.stop.set()
            hooks = rec.on("/hook")
            managers = rec.on("/api/v2/alerts")
            routed, unrouted = rec.on("/am-serving"), rec.on("/am-default")
    finally:
        if load is not None:
            load.stop.set()
        for p in reversed(procs):
            if p.poll() is None and p is not serve:
                p.send_signal(signal.SIGTERM)
        servers.stop(serve)  # with the replicas it started
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=30)
    text = log.read_text()
    assert [h["status"] for h in hooks] == ["firing", "resolved"], text
    fire, resolve = hooks[0]["alert"], hooks[1]["alert"]
    assert fire["id"] == resolve["id"] and fire["kind"] == "slo" and fire["rule"] == RULE
    assert hooks[0]["version"] == 1 and fire["version"] == 1 and resolve["resolved_at"] > fire["fired_at"]
    assert fire["measured_ratio"] >= 0.1 and fire["failed"] >= 1 and fire["outcomes"]["timeout"] >= 1
    assert fire["resolved_at"] is None
    assert fire["dashboard_url"] == f"{DASH}/spike?start_ns={fire['window_start_ns']}&end_ns=" \
                                    f"{fire['window_start_ns'] + 2_000_000_000}"
    assert fire["service"] is not None
    expected_labels = {"alertname": "TailscopeSLO", "kind": "slo", "metric": "e2e", "alert_id": fire["id"],
                       "source": "tailscope", "rule": RULE, "severity": "page", "service": fire["service"],
                       "team": "serving"}
    firing_am = [m for m in managers if "endsAt" not in m[0]]
    resolved_am = [m for m in managers if "endsAt" in m[0]]
    assert len(resolved_am) == 1 and firing_am, managers
    assert fire["baseline_p99_ms"] is None  # too few requests per 2 s window for a p99 baseline
    summary = f"SLO {RULE} broken: p99 {fire['p99_ms']:,.0f} ms, p50 {fire['p50_ms']:,.0f} ms"
    for body in firing_am:  # the fire, and Alertmanager's periodic re-sends of a firing alert: identical
        assert len(body) == 1 and set(body[0]) == {"labels", "annotations", "startsAt", "generatorURL"}
        assert body[0]["labels"] == expected_labels
        assert body[0]["annotations"]["summary"] == summary
        assert body[0]["startsAt"] == fire["fired_at"]
        assert body[0]["generatorURL"].startswith(f"{DASH}/spike?start_ns={fire['window_start_ns']}&end_ns=")
    assert resolved_am[0][0]["labels"] == expected_labels and resolved_am[0][0]["endsAt"] == resolve["resolved_at"]
    assert managers[-1] == resolved_am[0]  # nothing fired after the resolve
    assert text.count("FIRING") == 1 and text.count("RESOLVED") == 1, text  # one stdout line each, across the restart
    # the real Alertmanager: routed on the rule's labels, grouped by alertname and service, resolved
    assert unrouted == [], unrouted
    group = [g for g in groups if g["receiver"]["name"] == "serving"]
    assert len(group) == 1 and group[0]["labels"] == {"alertname": "TailscopeSLO", "service": fire["service"]}
    assert [a["labels"] for a in group[0]["alerts"]] == [expected_labels]
    assert group[0]["alerts"][0]["annotations"]["runbook"] == "http://127.0.0.1/rb#errors"
    assert routed[0]["status"] == "firing" and routed[-1]["status"] == "resolved", routed
    for note in routed:
        assert note["receiver"] == "serving" and note["groupLabels"] == group[0]["labels"]
        assert [a["labels"] for a in note["alerts"]] == [expected_labels]
    assert datetime.fromisoformat(routed[-1]["alerts"][0]["endsAt"]) == datetime.fromisoformat(resolve["resolved_at"])
