"""Retention: whole hours, oldest first, with their materialized requests; what stays reads as if the rest never was."""

from __future__ import annotations

import time
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from analysis import connect
from analysis.engine.materialize import REQUESTS_DIR, materialize, partition_dir
from intake.compact import retention as R
from tailscope.cli import app
from tailscope.commands.common import query_failure, store_hooks
from tests.factory import T0, add_request
from tracing.rows import SpanBatch
from tracing.store import HOUR_NS, SegmentWriter, hour_dirs, hour_of_dir, init_store

COLS = "trace_id, span_id, start_ns, e2e_ns, replica, ttft_ns, queue_wait_ns, generation_ns, decode_ns, other_ns"


def test_parse_duration() -> None:
    assert [R.parse_duration(t) for t in ("90m", "36h", "3d", "2w", "45s", "1.5h")] == [
        5400, 129600, 259200, 1209600, 45, 5400]
    for bad in ("3 days", "3", "d", "-1d", "0h"):
        with pytest.raises(ValueError, match="--retain"):
            R.parse_duration(bad)


def _week(stores: list[Path], keep_after_ns: int | None = None) -> None:
    """A request every 6 hours over 7 days after T0, some crossing into the next hour; into every store,
    or only those whose hour ends after `keep_after_ns`."""
    for k in range(7 * 4):
        start = k * 6 * HOUR_NS + (HOUR_NS - 2000 if k % 2 else 1000)  # odd ones end in the next hour
        batch = SpanBatch()
        add_request(batch, ("w", k), start, start + 5000, [("queue_wait", start, start + 1000),
                                                           ("generation", start + 1000, start + 5000)])
        table = batch.to_table()
        if keep_after_ns is not None:
            import pyarrow.compute as pc

            hour_end = pc.add(pc.multiply(pc.divide(table.column("TimestampNs"), HOUR_NS), HOUR_NS), HOUR_NS)
            table = table.filter(pc.greater(hour_end, keep_after_ns))
        for store in stores:
            if table.num_rows:
                SegmentWriter(store, kind="test").write(table)


def test_a_week_kept_three_days_reads_as_a_store_that_never_held_the_rest(tmp_path: Path) -> None:
    full, fresh = init_store(tmp_path / "full"), init_store(tmp_path / "fresh")
    _week([full])
    materialize(full)
    (full / "alerts").mkdir()
    (full / "alerts" / "state.json").write_text("{}")
    now_s = (T0 + 7 * 24 * HOUR_NS) / 1e9
    cutoff_ns = int((now_s - 3 * 86400) * 1e9)
    _week([fresh], keep_after_ns=cutoff_ns)
    old = connect(full)  # a connection opened before retention
    on_removed, extra_bytes = store_hooks(full)
    removed = R.apply(full, R.Retention(retain_s=3 * 86400), now_s, on_removed=on_removed, extra_bytes=extra_bytes)
    assert removed == sorted(removed) and removed and all(h + HOUR_NS <= cutoff_ns for h in removed)
    kept = [hour_of_dir(d) for d in hour_dirs(full)]
    assert kept == [hour_of_dir(d) for d in hour_dirs(fresh)] and min(kept) + HOUR_NS > cutoff_ns
    for h in removed:  # the materialized requests of removed hours went with them
        assert not partition_dir(full, h).exists()
    assert sorted(p.name for p in (full / REQUESTS_DIR).iterdir()) == sorted(
        p.name for p in (full / "spans").iterdir())
    assert (full / "alerts" / "state.json").read_text() == "{}"
    q = f"SELECT {COLS} FROM requests ORDER BY start_ns, trace_id"
    assert connect(full).execute(q).fetchall() == connect(fresh).execute(q).fetchall()
    assert len(connect(full).execute(q).fetchall()) == 3 * 4
    with pytest.raises(duckdb.Error) as info:  # the old connection listed the removed hours
        old.execute(f"SELECT {COLS} FROM spans").fetchall()
    line = query_failure("query", info.value)
    assert "\n" not in line and "the store changed under it" in line and "run it again" in line


def test_size_limit_removes_the_oldest_hours_never_the_newest(tmp_path: Path) -> None:
    store = init_store(tmp_path)
    _week([store])
    dirs = hour_dirs(store)
    sizes = [sum(f.stat().st_size for f in d.iterdir()) for d in dirs]
    limit = sum(sizes[-5:])  # room for the newest five hours
    removed = R.apply(store, R.Retention(max_bytes=limit), time.time())
    assert removed == [hour_of_dir(d) for d in dirs[:-5]]
    assert hour_dirs(store) == dirs[-5:]
    assert R.apply(store, R.Retention(max_bytes=1), time.time()) == [hour_of_dir(d) for d in dirs[-5:-1]]
    assert hour_dirs(store) == dirs[-1:]  # the newest hour stays whatever the limit


def test_compact_and_collect_options_apply_retention(tmp_path: Path) -> None:
    store = init_store(tmp_path)
    now_hour = (time.time_ns() // HOUR_NS) * HOUR_NS
    for hour in (now_hour - 8 * 24 * HOUR_NS, now_hour - HOUR_NS):
        batch = SpanBatch()
        add_request(batch, hour, hour - T0 + 1000, hour - T0 + 9000)
        SegmentWriter(store, kind="test").write(batch.to_table())
    result = CliRunner().invoke(app, ["compact", "--store", str(store), "--retain", "7d"])
    assert result.exit_code == 0, result.output
    assert "1 hour(s) removed by retention (7d)" in result.output
    assert [hour_of_dir(d) for d in hour_dirs(store)] == [now_hour - HOUR_NS]
    bad = CliRunner().invoke(app, ["collect", "--store", str(store), "--max-store-gb", "-1"])
    assert bad.exit_code == 1 and "--max-store-gb must be >= 0" in bad.output
