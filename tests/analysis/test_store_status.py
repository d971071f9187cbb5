"""`tailscope store` and analysis.engine.store_status: the figures, exactly, before and after compaction."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pyarrow.parquet as pq
from typer.testing import CliRunner

from analysis.engine.store_status import store_status
from intake.compact.merge import Compactor, Policy
from tailscope.cli import app
from tests.factory import T0
from tests.intake.compact_helpers import write_segments
from tracing.store import HOUR_NS, init_store, segment_files


def test_status_counts_exactly_and_follows_compaction(tmp_path: Path) -> None:
    store = init_store(tmp_path)
    rng = random.Random(2)
    write_segments(store, rng, 12)
    write_segments(store, rng, 3, hour=2)
    ts = [t for f in segment_files(store) for t in pq.read_table(f, columns=["TimestampNs"])[0].to_pylist()]
    later = time.time() + 3600  # both hours settled long ago, and their segments quiet for an hour
    s = store_status(store, now_s=later).as_dict()
    assert (s["hours"], s["files"], s["spans"], s["max_files_per_hour"]) == (2, 15, len(ts), 12)
    assert (s["oldest_span_ns"], s["newest_span_ns"]) == (min(ts), max(ts))
    assert s["pending_hours"] == 2 and s["retention"] == "off" and s["last_compaction_ns"] is None
    # the oldest hour waits since it settled: its end + settle (300 s), or its last write + quiet (60 s) if later
    last_write: dict[Path, float] = {}
    for f in segment_files(store):
        last_write[f.parent] = max(last_write.get(f.parent, 0.0), f.stat().st_mtime)
    hour_ends = sorted((T0 + h * HOUR_NS + HOUR_NS) / 1e9 for h in (0, 2))
    settled = [max(end + 300, w + 60) for end, w in zip(hour_ends, (last_write[d] for d in sorted(last_write)),
                                                        strict=True)]
    assert s["compaction_lag_s"] == round(later - min(settled), 1)
    assert 3_540 <= s["compaction_lag_s"] < 3_600  # written just now, in hours long past: they waited about an hour
    Compactor(store, Policy(quiet_s=0, durable=False)).run_once()
    s = store_status(store, now_s=later).as_dict()
    assert (s["files"], s["spans"], s["pending_hours"], s["compaction_lag_s"]) == (2, len(ts), 0, 0.0)
    assert [h["hidden"] for h in s["per_hour"]] == [12, 3] and s["last_compaction_ns"] is not None
    out = CliRunner().invoke(app, ["store", "--store", str(store), "--json"])
    assert out.exit_code == 0 and json.loads(out.stdout)["spans"] == len(ts)
    text = CliRunner().invoke(app, ["store", "--store", str(store)]).output
    assert "2 hour(s), 2 segment(s) (at most 1 in an hour)" in text and f"{len(ts):,} spans" in text
    missing = CliRunner().invoke(app, ["store", "--store", str(tmp_path / "nope")])
    assert missing.exit_code == 1 and "no store there" in missing.output
