"""Compaction: the same spans after as before (every column), levels, settled hours, grace, idempotence,
late spans, materialized requests kept fresh, quarantine, a full disk, the command."""

from __future__ import annotations

import errno
import os
import random
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from intake.compact.merge import Compactor, CompactorBusy, Policy
from tailscope.cli import app
from tests.intake.compact_helpers import keys, rows, write_segments
from tracing.store import HOUR_NS, QUARANTINE_DIR, hour_dirs, init_store, list_hour, segment_files, segment_level


@pytest.fixture
def later() -> float:
    """"Now" for a settled T0 hour: its segments' mtimes are real, so quiet_s counts from when they land. Read when
    the test starts, not when the module is imported (a worker may reach this file long after collecting it)."""
    return time.time() + 1000


def _policy(**kw: Any) -> Policy:
    base: dict[str, Any] = {"fan_in": 4, "target_bytes": 1 << 20, "settle_s": 300.0, "quiet_s": 60.0,
                               "grace_s": 600.0, "row_group_spans": 2048, "durable": False}
    base.update(kw)
    return Policy(**base)


def _sorted_with_row_groups(path: Path, row_group_spans: int) -> None:
    meta = pq.read_metadata(path)
    assert all(meta.row_group(i).num_rows <= row_group_spans for i in range(meta.num_row_groups))
    ts = pq.read_table(path, columns=["TimestampNs"]).column("TimestampNs").to_pylist()
    assert ts == sorted(ts), path


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_compaction_keeps_every_span_while_an_hour_is_written_and_after_it_settles(tmp_path: Path,
                                                                                   seed: int) -> None:
    rng = random.Random(seed)
    store = tmp_path / "s"
    policy = _policy()
    c = Compactor(init_store(store), policy)
    hour_ns = (time.time_ns() // HOUR_NS) * HOUR_NS  # the hour being written now
    end_s = (hour_ns + HOUR_NS) / 1e9
    for step in range(6):
        write_segments(store, rng, rng.randint(1, 9), tag=(seed, step), max_spans=40, base_ns=hour_ns)
        now = time.time()
        before = rows(store)
        c.run_once(now)
        assert rows(store) == before  # every span, every column, exactly as often
        for listing in (list_hour(d) for d in hour_dirs(store)):
            small = [f for f in listing.files if f.stat().st_size < policy.target_bytes // 2]
            for level in {segment_level(f.name) for f in small}:  # fewer than fan_in per level
                assert sum(segment_level(f.name) == level for f in small) < policy.fan_in
        now += 60
    # settled: the hour ended settle_s ago and nothing landed for quiet_s
    before = rows(store)
    r = c.run_once(end_s + 400)
    after_files = [f for d in hour_dirs(store) for f in list_hour(d).files]
    assert rows(store) == before
    assert len(after_files) == 1 and r.pending_hours == 0
    _sorted_with_row_groups(after_files[0], policy.row_group_spans)
    # idempotent: a second pass changes nothing
    r2 = c.run_once(end_s + 500)
    assert r2.merges == 0 and [f for d in hour_dirs(store) for f in list_hour(d).files] == after_files
    # late spans into the compacted hour: merged in at the next settled pass, every span still there once
    write_segments(store, rng, 3, tag=(seed, "late"), base_ns=hour_ns)
    late = rows(store)
    assert sum(late.values()) > sum(before.values())
    c.run_once(end_s + 10_000)
    assert rows(store) == late
    assert len([f for d in hour_dirs(store) for f in list_hour(d).files]) == 1


def test_an_hour_whose_writers_segments_are_all_merged_is_not_quiet_for_that(tmp_path: Path) -> None:
    # an hour that ended long ago gets segments now: merged in levels, but not settled until quiet_s after the
    # newest one landed, even once no writer's segment is left visible (the merged ones carry when it landed)
    rng = random.Random(8)
    c = Compactor(init_store(tmp_path), _policy())
    now = time.time()
    for tag in ("a", "b"):
        write_segments(tmp_path, rng, 4, tag=tag)
        c.run_once(now)  # one fan-in of 4: no writer's segment left visible
    before = rows(tmp_path)
    levels = sorted(segment_level(f.name) for f in segment_files(tmp_path))
    assert levels == [1, 1]  # not merged as a settled hour: spans landed less than quiet_s ago
    c.run_once(time.time() + 61)  # quiet_s after the last one landed
    assert [segment_level(f.name) for f in segment_files(tmp_path)] == [2]
    assert rows(tmp_path) == before


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_fast_lane_merges_only_the_lowest_levels_of_hours_being_written(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    store = tmp_path / "s"
    c = Compactor(init_store(store), _policy())
    hour_ns = (time.time_ns() // HOUR_NS) * HOUR_NS  # the hour being written now
    for step in range(16):  # 4 x 4 fan-ins of 4 writer segments each
        write_segments(store, rng, 4, tag=(seed, step), base_ns=hour_ns)
        for _ in range(8):  # bounded: each call merges at most once an hour
            if not c.fast_pass():
                break
    before = rows(store)
    levels = sorted(segment_level(f.name) for f in segment_files(store))
    assert levels == [2, 2, 2, 2]  # levels 0 and 1 merged by the fast lane, level 2 left to the pass
    assert c.fast_pass() == 0
    c.run_once()
    assert [segment_level(f.name) for f in segment_files(store)] == [3]
    assert rows(store) == before
    # a settled hour is the pass's alone
    write_segments(store, rng, 8, tag=(seed, "old"))  # T0's hour, long ended
    assert c.fast_pass(time.time() + 61) == 0


def test_merged_segments_stay_hidden_for_the_grace_then_go(tmp_path: Path, later: float) -> None:
    rng = random.Random(7)
    write_segments(tmp_path, rng, 10)
    before = rows(tmp_path)
    names_before = {p.name for p in (tmp_path / "spans").rglob("*.parquet")}
    c = Compactor(tmp_path, _policy())
    now = later
    c.run_once(now)
    on_disk = {p.name for p in (tmp_path / "spans").rglob("*.parquet")}
    assert names_before < on_disk  # the inputs are still there (a reader may hold them) ...
    assert rows(tmp_path) == before  # ... but no listing returns them
    c.run_once(now + 599)
    assert names_before < {p.name for p in (tmp_path / "spans").rglob("*.parquet")}
    r = c.run_once(now + 601)
    assert r.deleted == 10
    left = sorted(p.name for p in (tmp_path / "spans").rglob("*") if p.is_file())
    assert len(left) == 2 and left[0].endswith(".parquet") and left[1].endswith(".replaces")
    assert rows(tmp_path) == before


def test_one_compactor_per_store(tmp_path: Path) -> None:
    write_segments(tmp_path, random.Random(1), 2)
    with Compactor(tmp_path, _policy()), pytest.raises(CompactorBusy, match="already being compacted"):
        Compactor(tmp_path, _policy()).acquire()


def test_materialized_requests_stay_fresh_through_a_merge_and_go_stale_on_new_spans(tmp_path: Path,
                                                                                   later: float) -> None:
    from analysis import connect
    from analysis.engine.materialize import materialize, snapshot

    rng = random.Random(3)
    write_segments(tmp_path, rng, 12)
    write_segments(tmp_path, rng, 5, hour=1)
    assert len(materialize(tmp_path)) == 2
    q = "SELECT * FROM requests ORDER BY trace_id, span_id"
    want = connect(tmp_path).execute(q).fetchall()
    Compactor(tmp_path, _policy()).run_once(later)
    assert len([f for d in hour_dirs(tmp_path) for f in list_hour(d).files]) == 2
    snap = snapshot(tmp_path)
    assert snap.stale == [] and len(snap.fresh) == 2  # same spans, same keys: nothing rebuilt
    assert connect(tmp_path).execute(q).fetchall() == want
    write_segments(tmp_path, rng, 1, hour=1)
    assert len(snapshot(tmp_path).stale) == 2  # new spans: that hour and the one reading it are stale


def test_an_unreadable_segment_is_moved_to_quarantine_never_deleted(tmp_path: Path, later: float) -> None:
    rng = random.Random(5)
    write_segments(tmp_path, rng, 6)
    hour = hour_dirs(tmp_path)[0]
    good = next(iter(sorted(hour.glob("*.parquet"))))
    (hour / "broken.parquet").write_bytes(good.read_bytes()[:200])  # a truncated segment
    said: list[str] = []
    c = Compactor(tmp_path, _policy(), say=said.append)
    c.run_once(later)
    moved = tmp_path / QUARANTINE_DIR / hour.parent.name / hour.name / "broken.parquet"
    assert moved.read_bytes() == good.read_bytes()[:200]
    assert len(said) == 1 and "broken.parquet" in said[0] and "quarantine" in said[0]
    assert len(list_hour(hour).files) == 1


def test_a_full_disk_leaves_the_segments_and_retries_later(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           later: float) -> None:
    rng = random.Random(6)
    write_segments(tmp_path, rng, 8)
    before = rows(tmp_path)
    names = sorted(p.name for p in (tmp_path / "spans").rglob("*"))
    said: list[str] = []
    c = Compactor(tmp_path, _policy(retry_s=30.0), say=said.append)
    real = Compactor._write

    def full(self: Compactor, table: pa.Table, path: Path) -> None:
        with open(path, "wb") as fh:
            fh.write(b"x" * 100)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Compactor, "_write", full)
    r = c.run_once(later)
    assert r.failed == 1 and r.merges == 0
    assert sorted(p.name for p in (tmp_path / "spans").rglob("*")) == names  # no temporary, no record left
    assert len(said) == 1 and "No space left on device" in said[0] and "retrying in 30 s" in said[0]
    monkeypatch.setattr(Compactor, "_write", real)
    assert c.run_once(later + 10).merges == 0  # still waiting
    assert c.run_once(later + 31).merges >= 1
    assert rows(tmp_path) == before


#: the command on segments just written: settled at once, merged segments deleted at the next run
NOW_OPTIONS = ("--compact-grace-s", "0", "--compact-quiet-s", "0")


def test_compact_command(tmp_path: Path) -> None:
    write_segments(tmp_path, random.Random(8), 20)
    before = keys(tmp_path)
    result = CliRunner().invoke(app, ["compact", "--store", str(tmp_path), *NOW_OPTIONS])
    assert result.exit_code == 0, result.output
    assert "merge(s) of 20 segments" in result.output and "now 1 segment(s) in 1 hour(s)" in result.output
    assert keys(tmp_path) == before
    result = CliRunner().invoke(app, ["compact", "--store", str(tmp_path), *NOW_OPTIONS])
    assert "0 merge(s)" in result.output and "20 merged segment(s) deleted" in result.output
    assert len(list((tmp_path / "spans").rglob("*.parquet"))) == 1
    bad = CliRunner().invoke(app, ["compact", "--store", str(tmp_path), "--retain", "3 days"])
    assert bad.exit_code == 1 and "--retain '3 days'" in bad.output


def test_the_compactors_figures_on_metrics(tmp_path: Path, later: float) -> None:
    from intake.collect.metrics import compaction_hooks

    write_segments(tmp_path, random.Random(3), 10)
    clock = [later]
    c = Compactor(tmp_path, _policy(), clock=lambda: clock[0])
    hooks = {h.name: h for h in compaction_hooks(c)}
    before = {name: h.read() for name, h in hooks.items()}
    assert before == {"tailscope_compaction_pending_hours": None, "tailscope_compaction_max_files_per_hour": None,
                      "tailscope_compaction_last_pass_age_seconds": None, "tailscope_compaction_merges": 0.0,
                      "tailscope_compaction_failed": None, "tailscope_retention_removed_hours": 0.0}
    r = c.run_once(later)
    clock[0] = later + 12.5
    after = {name: h.read() for name, h in hooks.items()}
    assert r.merges >= 1 and after == {
        "tailscope_compaction_pending_hours": float(r.pending_hours),
        "tailscope_compaction_max_files_per_hour": float(r.max_files_per_hour),
        "tailscope_compaction_last_pass_age_seconds": 12.5, "tailscope_compaction_merges": float(r.merges),
        "tailscope_compaction_failed": 0.0, "tailscope_retention_removed_hours": 0.0}
    assert hooks["tailscope_compaction_merges"].kind == hooks["tailscope_retention_removed_hours"].kind == "counter"
