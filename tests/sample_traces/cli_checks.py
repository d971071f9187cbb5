"""What the engine accuracy suites share: the stage columns, a store ingested through the real CLI, `sql` rows,
and ISO times from `report --json` back to nanoseconds."""

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
