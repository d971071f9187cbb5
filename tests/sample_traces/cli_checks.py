"""What the engine accuracy suites share: the stage columns, a store ingested through the real CLI, `sql` rows,
ISO times from `report --json` back to nanoseconds, and the check of the report's first spike."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from tailscope.cli import app

runner = CliRunner()
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
STAGES = ("network_ns", "queue_wait_ns", "preprocess_ns", "model_load_ns", "generation_ns", "prefill_ns",
          "decode_ns", "streaming_ns", "other_ns")


def ingested(path: Path, traces: Path) -> Path:
    """A store at `path` filled by `tailscope ingest --quiet` from `traces`."""
    result = runner.invoke(app, ["ingest", "--quiet", "--store", str(path), str(traces)])
    assert result.exit_code == 0, result.output
    return path


def sql(store: Path, query: str) -> list[dict[str, Any]]:
    """`tailscope sql --format json` rows."""
    result = runner.invoke(app, ["sql", query, "--store", str(store), "--format", "json"])
    assert result.exit_code == 0, result.output
    rows: list[dict[str, Any]] = json.loads(result.stdout)
    return rows


def ns_of(iso: str) -> int:
    """Nanoseconds since the epoch of an ISO time printed by the report (microsecond precision)."""
    stamp = datetime.fromisoformat(iso)
    return (stamp - EPOCH) // timedelta(microseconds=1) * 1_000


def first_spike(store: Path, truth: dict[str, Any], *, stage: str | None = None, value: str | None = None
                ) -> dict[str, Any]:
    """`tailscope report --store STORE --json`'s first spike, returned once checked: it covers the truth's window
    (one report window of slack each side), names `stage` (default: the truth's) first and the truth's dimension
    with `value` (default: the truth's) as its first dimension."""
    result = runner.invoke(app, ["report", "--store", str(store), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["spikes"], report["errors"]
    spike: dict[str, Any] = report["spikes"][0]
    window = truth["window"]
    slack = report["window_s"] * 1_000_000_000
    start_ns, end_ns = ns_of(spike["start"]), ns_of(spike["end"])
    assert window["start_ns"] - slack <= start_ns < window["end_ns"]
    assert window["start_ns"] < end_ns <= window["end_ns"] + slack
    assert spike["stages"][0]["stage"] == (truth["stage"] if stage is None else stage)
    first = spike["dimensions"][0]
    assert (first["dimension"], first["value"]) == (truth["dimension"], truth["value"] if value is None else value)
    return spike
