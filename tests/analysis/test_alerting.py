"""Alert delivery: exact payloads, the outbox across a crash, retries with backoff, a failing receiver isolated."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from analysis.watch import Event
from analysis.watch.delivery import (
    Deliverer,
    Outbox,
    Receiver,
    alertmanager_payload,
    receivers_from,
    webhook_payload,
)
from tests.analysis.alert_receiver import recording
from tracing.store import init_store


def _alert(status: str = "firing") -> dict[str, Any]:
    return {"version": 1, "id": "abc123", "kind": "tail_spike", "status": status, "rule": None, "metric": "e2e",
            "fired_at": "2025-11-20T14:07:00Z", "resolved_at": "2025-11-20T14:10:00Z" if status == "resolved" else None,
            "window_start": "2025-11-20T14:05:00Z", "window_end": "2025-11-20T14:06:00Z", "p50_ms": 3682.3,
            "p99_ms": 26876.3, "baseline_p99_ms": 16939.5, "stage": "decode", "stage_share": 0.9467,
            "dimension": "replica", "value": "replica-07", "explained": 0.7, "exemplars": ["t1", "t2"],
            "dashboard_url": "http://127.0.0.1:8501/spike?start_ns=1&end_ns=2", "requests": 1234,
            "p99_without_ms": 19001.2, "service": "chat", "filters": [], "labels": {"team": "gpu"},
            "annotations": {"runbook_url": "http://runbooks/#tail"}}


def test_payloads_are_exact() -> None:
    fire = Event("firing", _alert())
    assert webhook_payload(fire) == {"version": 1, "source": "tailscope", "status": "firing", "alert": _alert()}
    assert alertmanager_payload(fire) == [{
        "labels": {"alertname": "TailscopeTailSpike", "kind": "tail_spike", "metric": "e2e", "alert_id": "abc123",
                   "source": "tailscope", "severity": "warning", "service": "chat", "stage": "decode",
                   "dimension": "replica", "value": "replica-07", "team": "gpu"},
        "annotations": {"summary": "p99 of e2e spiked: p99 26,876 ms against a baseline of 16,940 ms, "
                                   "p50 3,682 ms",
                        "description": "Window 2025-11-20T14:05:00Z to 2025-11-20T14:06:00Z, 1,234 requests. "
                                       "95% of the excess is in stage decode. Without replica=replica-07, p99 falls "
                                       "from 26,876 ms to 19,001 ms (70% of the excess). Exemplar traces: t1, t2.",
                        "window_start": "2025-11-20T14:05:00Z", "window_end": "2025-11-20T14:06:00Z",
                        "dashboard": "http://127.0.0.1:8501/spike?start_ns=1&end_ns=2",
                        "stage": "decode", "dimension": "replica", "value": "replica-07", "stage_share": "0.95",
                        "explained": "0.70", "exemplars": "t1,t2", "runbook_url": "http://runbooks/#tail"},
        "startsAt": "2025-11-20T14:07:00Z", "generatorURL": "http://127.0.0.1:8501/spike?start_ns=1&end_ns=2"}]
    paged = _alert() | {"labels": {"severity": "page"}, "value": "x" * 100}
    labels = alertmanager_payload(Event("firing", paged))[0]["labels"]
    assert labels["severity"] == "page" and labels["value"] == "x" * 63 + "…"  # the rule's severity; value cut
    resolved = alertmanager_payload(Event("resolved", _alert("resolved")))[0]
    assert resolved["endsAt"] == "2025-11-20T14:10:00Z" and resolved["startsAt"] == "2025-11-20T14:07:00Z"


def test_the_outbox_redelivers_after_a_crash_exactly_once(tmp_path: Path) -> None:
    store = init_store(tmp_path / "store")
    with recording() as rec:
        receivers = receivers_from([rec.url("/hook")], [rec.url()])
        fire = Event("firing", _alert())
        assert Outbox(store, receivers).enqueue(fire) == 2  # ... and the process dies before delivering
        outbox = Outbox(store, receivers)  # after the restart
        assert outbox.enqueue(fire) == 0  # re-evaluating the same window enqueues nothing new
        Deliverer(outbox).deliver_once()
        assert rec.on("/hook") == [webhook_payload(fire)]
        assert rec.on("/api/v2/alerts") == [alertmanager_payload(fire)]
        assert Outbox(store, receivers).enqueue(fire) == 0  # delivered entries are remembered too
        Deliverer(Outbox(store, receivers)).deliver_once()
        assert len(rec.posts) == 2


def test_a_failing_receiver_is_retried_in_order_and_does_not_hold_the_others(tmp_path: Path) -> None:
    store = init_store(tmp_path / "store")
    with recording(fail_first=2) as bad, recording() as good:
        receivers = [Receiver("bad", "webhook", bad.url("/hook")), Receiver("good", "webhook", good.url("/hook"))]
        outbox = Outbox(store, receivers)
        fire, resolve = Event("firing", _alert()), Event("resolved", _alert("resolved"))
        outbox.enqueue(fire)
        outbox.enqueue(resolve)
        deliverer = Deliverer(outbox, backoff=(0.01, 0.02))
        wait = deliverer.deliver_once()
        assert [b["status"] for b in good.on("/hook")] == ["firing", "resolved"]  # not held by the bad one
        assert bad.on("/hook") == [] and len(bad.failed) == 1 and 0 < wait <= 0.01
        for _ in range(200):  # bounded: the backoff is 10-20 ms, waited out as the deliverer says
            if not outbox.pending(receivers[0]):
                break
            time.sleep(min(wait, 0.05))
            wait = deliverer.deliver_once()
        assert [b["status"] for b in bad.on("/hook")] == ["firing", "resolved"]  # order kept across retries
        assert len(bad.failed) == 2 and deliverer.failures == 2 and deliverer.sent == 4


def test_receiver_names_are_stable_and_distinct() -> None:
    a = receivers_from(["http://127.0.0.1:1/a", "http://127.0.0.1:1/b"], ["http://127.0.0.1:2"])
    b = receivers_from(["http://127.0.0.1:1/b", "http://127.0.0.1:1/a"], ["http://127.0.0.1:2"])
    assert {r.name: r.url for r in a} == {r.name: r.url for r in b} and len({r.name for r in a}) == 3
    assert a[2].post_url == "http://127.0.0.1:2/api/v2/alerts"


def test_a_receiver_url_that_is_not_http_is_refused_in_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tailscope.cli import app
    store = init_store(tmp_path / "store")
    result = CliRunner().invoke(app, ["watch", "--once", "--store", str(store), "--webhook", "ftp://x"])
    assert result.exit_code == 1 and "receiver URL 'ftp://x' is not an http(s) URL" in result.output
    assert "Traceback" not in result.output
    result = CliRunner().invoke(app, ["watch", "--once", "--store", str(store), "--window", "soon"])
    assert result.exit_code == 1 and "cannot read duration 'soon'" in result.output


def test_once_on_a_store_without_requests_evaluates_and_exits(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from analysis.watch import AlertStore
    from tailscope.cli import app
    store = init_store(tmp_path / "store")
    result = CliRunner().invoke(app, ["watch", "--once", "--store", str(store), "--window", "10s", "--delay", "0"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("watching ") and "FIRING" not in result.output
    state = AlertStore(store).load_state()
    assert state["active"] == {} and state["last_window_end_ns"] % 10_000_000_000 == 0
