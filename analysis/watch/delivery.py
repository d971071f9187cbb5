"""Alert delivery: payloads (generic webhook, Alertmanager v2) and a crash-safe outbox with a delivery thread.

Each fire or resolve is written to STORE/alerts/outbox/<receiver>/<id>.<status>.json
(temp-then-rename) before the watch moves on; the `Deliverer` thread posts pending
entries in order, retries with exponential backoff, and moves each delivered entry to
STORE/alerts/delivered/<receiver>/. An entry already pending or delivered is never
enqueued again, so a watch killed between firing and delivering re-delivers after the
restart, once per (alert id, status); receivers dedupe on the stable alert id in the
rare case of a crash after a POST succeeded and before its entry moved. A failing
receiver only delays its own entries: evaluation never waits on delivery.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from analysis.watch.records import ALERT_VERSION, ALERTS_DIR, Event, alert_description, alert_labels, alert_summary
from tracing.errors import QueryError
from tracing.store import write_atomic

#: Version of the webhook payload (the alert record inside has its own `version`).
WEBHOOK_VERSION: Final = ALERT_VERSION
#: Pending entries kept per receiver; beyond this the oldest is dropped (with a line on stderr).
MAX_PENDING: Final = 1000
#: Seconds between the first retry and the cap of the exponential backoff.
BACKOFF_S: Final = (0.5, 60.0)
#: Seconds an HTTP POST may take.
POST_TIMEOUT_S: Final = 5.0


@dataclass(frozen=True)
class Receiver:
    """Where alerts go: kind "webhook" (POST the payload to url) or "alertmanager" (url is the base URL)."""

    name: str
    kind: str
    url: str

    @property
    def post_url(self) -> str:
        """The URL posted to."""
        if self.kind == "alertmanager":
            return self.url.rstrip("/") + "/api/v2/alerts"
        return self.url


def webhook_payload(ev: Event) -> dict[str, Any]:
    """The generic webhook body (docs/watch.md): version, status and the alert record."""
    return {"version": WEBHOOK_VERSION, "source": "tailscope", "status": ev.status, "alert": ev.alert}


def alertmanager_alert(alert: dict[str, Any], status: str) -> dict[str, Any]:
    """One Alertmanager v2 PostableAlert: labels identify and route the alert (records.alert_labels),
    annotations carry the explanation (summary, description with the counterfactual, dashboard link)."""
    annotations = {"summary": alert_summary(alert), "description": alert_description(alert),
                   "window_start": alert["window_start"], "window_end": alert["window_end"]}
    if alert.get("dashboard_url"):
        annotations["dashboard"] = alert["dashboard_url"]
    for key in ("stage", "dimension", "value"):
        if alert.get(key) is not None:
            annotations[key] = str(alert[key])
    if alert.get("stage_share") is not None:
        annotations["stage_share"] = f"{alert['stage_share']:.2f}"
    if alert.get("explained") is not None:
        annotations["explained"] = f"{alert['explained']:.2f}"
    if alert.get("exemplars"):
        annotations["exemplars"] = ",".join(alert["exemplars"])
    annotations |= dict(alert.get("annotations") or {})
    out: dict[str, Any] = {"labels": alert_labels(alert), "annotations": annotations, "startsAt": alert["fired_at"]}
    if status == "resolved" and alert.get("resolved_at"):
        out["endsAt"] = alert["resolved_at"]
    if alert.get("dashboard_url"):
        out["generatorURL"] = alert["dashboard_url"]
    return out


def alertmanager_payload(ev: Event) -> list[dict[str, Any]]:
    """The body of POST /api/v2/alerts: a list of PostableAlert."""
    return [alertmanager_alert(ev.alert, ev.status)]


def payload_for(receiver: Receiver, ev: Event) -> Any:
    """What a receiver is sent for an event."""
    return alertmanager_payload(ev) if receiver.kind == "alertmanager" else webhook_payload(ev)


def post_json(url: str, body: Any, timeout: float = POST_TIMEOUT_S) -> None:
    """POST JSON; raises OSError (urllib errors included) unless the answer is 2xx."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "User-Agent": "tailscope-watch"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        resp.read()
        if not 200 <= resp.status < 300:
            raise OSError(f"HTTP {resp.status}")


class Outbox:
    """Pending and delivered entries on disk, per receiver."""

    def __init__(self, store: Path, receivers: list[Receiver]) -> None:
        self.root = Path(store) / ALERTS_DIR
        self.receivers = receivers
        self._seq = 0
        self._lock = threading.Lock()

    def _dirs(self, receiver: Receiver) -> tuple[Path, Path]:
        return self.root / "outbox" / receiver.name, self.root / "delivered" / receiver.name

    def enqueue(self, ev: Event) -> int:
        """Add the event for every receiver that has neither pending nor delivered it; returns entries added."""
        added = 0
        name = f"{ev.alert['id']}.{ev.status}.json"
        for receiver in self.receivers:
            pending, done = self._dirs(receiver)
            if (pending / name).exists() or (done / name).exists():
                continue
            with self._lock:
                self._seq += 1
                seq = self._seq
            entry = {"created_ns": time.time_ns(), "seq": seq, "status": ev.status,
                     "payload": payload_for(receiver, ev), "alert_id": ev.alert["id"]}
            write_atomic(pending / name, json.dumps(entry).encode())
            added += 1
            self._bound(receiver)
        return added

    def _bound(self, receiver: Receiver) -> None:
        entries = self.pending(receiver)
        for path, _ in entries[:max(0, len(entries) - MAX_PENDING)]:
            print(f"tailscope watch: outbox of {receiver.name} is full; dropped {path.name}", file=sys.stderr)
            path.unlink(missing_ok=True)

    def pending(self, receiver: Receiver) -> list[tuple[Path, dict[str, Any]]]:
        """Pending entries of a receiver, oldest first."""
        pending, _ = self._dirs(receiver)
        out = []
        for path in pending.glob("*.json") if pending.is_dir() else []:
            try:
                out.append((path, json.loads(path.read_text())))
            except (OSError, ValueError):
                continue
        out.sort(key=lambda e: (e[1].get("created_ns", 0), e[1].get("seq", 0), e[0].name))
        return out

    def delivered(self, receiver: Receiver, path: Path) -> None:
        """Move an entry to delivered/ (atomic rename)."""
        _, done = self._dirs(receiver)
        done.mkdir(parents=True, exist_ok=True)
        os.replace(path, done / path.name)


class Deliverer:
    """The delivery thread: posts pending entries per receiver in order, retrying with backoff."""

    def __init__(self, outbox: Outbox, *, backoff: tuple[float, float] = BACKOFF_S,
                 timeout: float = POST_TIMEOUT_S) -> None:
        self.outbox = outbox
        self.backoff = backoff
        self.timeout = timeout
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._retry: dict[str, tuple[int, float]] = {}  # entry path -> (attempts, next try monotonic)
        self._refresh: deque[tuple[Receiver, Any]] = deque(maxlen=100)
        self._thread = threading.Thread(target=self._run, name="tailscope-watch-delivery", daemon=True)
        self.sent = 0
        self.failures = 0

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def wake(self) -> None:
        """Ask the thread to look at the outbox now."""
        self._wake.set()

    def refresh(self, active: list[dict[str, Any]]) -> None:
        """Re-send the firing alerts to Alertmanager receivers (best effort, never retried, bounded)."""
        for receiver in self.outbox.receivers:
            if receiver.kind == "alertmanager" and active:
                self._refresh.append((receiver, [alertmanager_alert(a, "firing") for a in active]))
        self._wake.set()

    def stop(self, drain_s: float = 2.0) -> None:
        """Stop the thread after at most `drain_s` more seconds of delivering."""
        deadline = time.monotonic() + drain_s
        while time.monotonic() < deadline and self.busy():
            self._wake.set()
            time.sleep(0.05)
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.timeout + 1)

    def busy(self) -> bool:
        """True while some receiver has a pending entry that is due."""
        now = time.monotonic()
        for receiver in self.outbox.receivers:
            for path, _ in self.outbox.pending(receiver):
                if self._retry.get(str(path), (0, 0.0))[1] <= now:
                    return True
                break
        return False

    def deliver_once(self) -> float:
        """One pass over every receiver; returns seconds until the next retry is due (inf if none)."""
        wait = float("inf")
        while self._refresh:
            receiver, body = self._refresh.popleft()
            with contextlib.suppress(OSError, ValueError):
                post_json(receiver.post_url, body, self.timeout)
        for receiver in self.outbox.receivers:
            for path, entry in self.outbox.pending(receiver):
                key = str(path)
                attempts, due = self._retry.get(key, (0, 0.0))
                now = time.monotonic()
                if due > now:
                    wait = min(wait, due - now)
                    break  # keep order: nothing after an entry waiting for its retry
                try:
                    post_json(receiver.post_url, entry["payload"], self.timeout)
                except (OSError, ValueError) as exc:
                    attempts += 1
                    delay = min(self.backoff[0] * 2 ** (attempts - 1), self.backoff[1])
                    self._retry[key] = (attempts, time.monotonic() + delay)
                    self.failures += 1
                    if attempts in (1, 5) or attempts % 20 == 0:
                        print(f"tailscope watch: delivery to {receiver.name} failed ({exc}); "
                              f"retry {attempts} in {delay:.1f} s", file=sys.stderr)
                    wait = min(wait, delay)
                    break
                self.outbox.delivered(receiver, path)
                self._retry.pop(key, None)
                self.sent += 1
        return wait

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                wait = self.deliver_once()
            except OSError as exc:  # the store's disk: say so and keep the thread alive
                print(f"tailscope watch: outbox error ({exc})", file=sys.stderr)
                wait = 1.0
            self._wake.wait(timeout=min(wait, 1.0))
            self._wake.clear()


def receivers_from(webhooks: list[str], alertmanagers: list[str]) -> list[Receiver]:
    """Receivers named from command-line URLs: kind and a hash of the URL (stable across restarts and reorders)."""
    for url in [*webhooks, *alertmanagers]:
        if not url.startswith(("http://", "https://")) or len(url.split("://", 1)[1]) == 0:
            raise QueryError("", f"receiver URL {url!r} is not an http(s) URL; write e.g. http://127.0.0.1:9093")

    def name(kind: str, url: str) -> str:
        return f"{kind}-{hashlib.sha256(url.encode()).hexdigest()[:10]}"
    out = [Receiver(name("webhook", u), "webhook", u) for u in dict.fromkeys(webhooks)]
    out += [Receiver(name("alertmanager", u), "alertmanager", u) for u in dict.fromkeys(alertmanagers)]
    return out
