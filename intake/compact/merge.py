"""Compaction: the segments of an hour partition merged, in levels, into a few large sorted files.

A receiver writes one small segment per group commit. The compactor keeps each hour's file
count small (docs/collect.md, "What happens to files"):

- While an hour is written, `fan_in` segments of one level that are below half the target
  size are merged into one segment of the next level (level 0: any segment a writer made;
  level N: `cN-<id>.parquet`), so an hour holds fewer than `fan_in` files per level.
- Once the hour has settled (it ended `settle_s` ago and no segment landed for `quiet_s`),
  its remaining small segments are merged into files of up to the target size, sorted by
  TimestampNs, with row groups of `row_group_spans` spans (time-range reads prune by them).
  Late spans make a new small segment, merged the same way at the next pass.

A merge is atomic for readers (tracing.store.list_hour): the output's record, naming its
inputs, is fsynced before the output gets its name, and a listing that sees the output
leaves its inputs out. The inputs stay on disk `grace_s` (for readers that listed them
before) and are then deleted, inputs before the record that hides them. A kill -9 at any
point leaves either the inputs visible (the output never got its name: its temporary and
orphan record are removed at the next start) or the output visible (its inputs are deleted
later), never both, never neither; a merge that is done is never redone (idempotent).
A segment that cannot be read is moved to STORE/quarantine/ with one line naming it; a
write that fails (a full disk) removes its temporary, keeps the inputs, and is retried after
`retry_s`. One compactor per store at a time (an flock on STORE/.compact.lock). DuckDB does
the merge (an out-of-core sort within the policy's `memory_mib`), so its memory does not follow
the target size.

In the background (`run`) two lanes merge at once: the pass (every level, settled hours,
deletions, retention) and a fast lane for the lowest levels (FAST_LEVELS), whose small merges
bound an hour's file count while a long merge runs. A lane claims its inputs before merging and
refuses a plan that names a segment another lane merges now or has merged since it listed the
hour; both lanes' merges share one DuckDB database, so one memory limit bounds them together.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from intake.compact import retention as R
from intake.compact.policy import Policy
from tracing.errors import StoreError
from tracing.store import (
    COMPACTED,
    COMPACTION_STATE,
    HOUR_NS,
    QUARANTINE_DIR,
    RECORD_SUFFIX,
    HourListing,
    combine_digests,
    fsync_path,
    hour_dirs,
    hour_of_dir,
    list_hour,
    read_record,
    require_store,
    segment_level,
)

#: Directory (in the store) where a merge's sort spills; emptied by DuckDB as it goes.
SPILL_DIR = ".compact-tmp"
#: At most this many segments read by one merge (DuckDB keeps state per file it reads: 3,000 did not fit in
#: 128 MB); a settled hour of more is merged in rounds.
MAX_INPUTS = 64
#: At most this many fan-ins of one level merged at once when segments piled up during a long merge.
CATCH_UP = 8
#: The lock file a compactor holds (flock) while it works on a store.
LOCK_NAME = ".compact.lock"
#: Levels the fast lane merges (0: writers' segments, 1: their first merges): small merges, cheap, and the ones
#: that bound an hour's file count while spans arrive.
FAST_LEVELS = 2
#: What the merges cost beyond DuckDB's memory limit: the database itself (28 MiB) and allocations its limit does
#: not count (about 30 MiB), measured at limits of 96 and 128 MiB (benchmarks/bench_compact.py, "memory"). DuckDB
#: gets the policy's `memory_mib` less this, so the merges' memory, all told, stays within `memory_mib`.
DUCKDB_OVERHEAD_MIB = 64
#: Parquet bytes a merge may read per MiB of DuckDB's memory limit: its sort holds about 1 KiB a span in memory and
#: does not spill all of it (at 128 MiB, 58,000 spans from 1.6 MiB of segments merged; 120,000 from 6 MiB ran out),
#: so a merge reads at most 2 MiB at the default budget, and files of half that are final.
SORT_BYTES_PER_MIB = 16 << 10
#: Seconds the fast lane waits when it found nothing to merge.
FAST_WAIT_S = 0.1


class CompactorBusy(StoreError):
    """Another process compacts this store already."""


@dataclass
class PassResult:
    """What one pass did."""

    merges: int = 0
    merged_segments: int = 0
    written_spans: int = 0
    deleted: int = 0
    quarantined: list[Path] = field(default_factory=list)
    failed: int = 0
    hours: int = 0
    files: int = 0  # visible segments after the pass
    max_files_per_hour: int = 0
    pending_hours: int = 0  # settled hours still holding small segments after the pass
    removed_hours: list[int] = field(default_factory=list)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class Compactor:
    """Compacts one store: `run_once()` for one pass (`tailscope compact`), `run(stop)` to keep at it (collect).

    `say` gets the one-line messages (quarantined segments, failed merges); `retention` is
    called once per pass, under the same lock, with the time (intake.compact.retention).
    """

    def __init__(self, store: Path, policy: Policy | None = None, *, say: Callable[[str], None] | None = None,
                 retention: Callable[[float], list[int]] | None = None, retention_text: str = "off",
                 merge: bool = True, clock: Callable[[], float] = time.time) -> None:
        self.store = require_store(Path(store))
        self.policy = policy or Policy()
        #: what a merge reads at most, and makes: the policy's target, within what the memory budget can sort
        self.target = min(self.policy.target_bytes,
                          (self.policy.memory_mib - DUCKDB_OVERHEAD_MIB) * SORT_BYTES_PER_MIB)
        self.say = say or (lambda line: None)
        self.retention = retention
        self.clock = clock
        #: False: only retention and the deletion of merged segments (`tailscope collect --no-compact`)
        self.merge = merge
        self._lock_fd: int | None = None
        self._mutex = threading.Lock()  # guards _busy, _db and figures (two lanes)
        self._busy: set[Path] = set()  # inputs of merges running now: no other lane may take them
        self._merged: set[Path] = set()  # inputs of committed merges still on disk: a stale listing's plan is refused
        self._db: duckdb.DuckDBPyConnection | None = None  # one database for both lanes: one memory limit
        self._records: dict[str, dict[str, Any]] = {}  # list_hour's cache of merge records, by segment path
        self._fast_idle: dict[Path, int] = {}  # the fast lane: hour directory -> mtime when it had nothing to do
        self._retry_at = 0.0
        self._cleaned: set[Path] = set()  # records whose inputs are all deleted
        self._seen: set[Path] = set()
        self.last: PassResult = PassResult()
        self.passes = 0
        self.total_merges = 0
        self.removed_hours = 0
        #: when the last pass ended (the clock's seconds; None before the first)
        self.last_pass_s: float | None = None
        #: the progress signal: when the first of the passes since the last merge (in any lane) started, i.e. the
        #: store has been in shape since then; None while merges go on
        self.idle_since: float | None = None
        #: what `tailscope store` prints as the retention ("3d, 20 GB" or "off")
        self.retention_text = retention_text
        #: running figures (instrumentation): merges and their seconds by level, pass and listing seconds
        self.figures: dict[str, Any] = {"merges_by_level": {}, "merge_s_by_level": {}, "inputs_by_level": {},
                                        "pass_s": 0.0, "max_pass_s": 0.0, "list_s": 0.0, "plan_s": 0.0,
                                        "write_s": 0.0, "commit_s": 0.0, "max_backlog": 0}

    # --- the lock and recovery ----------------------------------------------------------

    def acquire(self) -> None:
        """Take the store's compaction lock (CompactorBusy if another process holds it), then undo what a
        killed compactor left: temporaries, spilled sort runs and records whose output never got its name."""
        if self._lock_fd is not None:
            return
        path = self.store / LOCK_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            holder = path.read_text().strip() or "another process"
            raise CompactorBusy(f"{self.store}: already being compacted (pid {holder}); "
                                "one compactor per store (a running `tailscope collect` compacts it)") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd
        shutil.rmtree(self.store / SPILL_DIR, ignore_errors=True)  # a killed merge's spilled sort runs
        for directory in hour_dirs(self.store):
            self._recover(directory)

    def release(self) -> None:
        """Let go of the lock (and of the merges' database)."""
        with self._mutex:
            if self._db is not None:
                self._db.close()
                self._db = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> Compactor:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _recover(self, directory: Path) -> None:
        try:
            entries = list(os.scandir(directory))
        except FileNotFoundError:
            return
        names = {e.name for e in entries}
        for e in entries:
            orphan = e.name.endswith(RECORD_SUFFIX) and e.name[0] == "c" and (
                e.name.removesuffix(RECORD_SUFFIX) + ".parquet") not in names
            ours = e.name.startswith(".c") and e.name.endswith(".ctmp")
            if orphan or ours:
                Path(e.path).unlink(missing_ok=True)

    # --- a pass --------------------------------------------------------------------------

    def run_once(self, now: float | None = None) -> PassResult:
        """One pass over every hour: merges, deletions of replaced segments past their grace, retention."""
        self.acquire()
        t_pass = time.perf_counter()
        now = self.clock() if now is None else now
        result = PassResult()
        with self._mutex:
            merges_before = self.total_merges
        if self.retention is not None:
            try:
                result.removed_hours = self.retention(now)
            except OSError as exc:
                self.say(f"compact: retention failed ({_first_line(exc)}); will retry")
        self._seen = set()
        directories = hour_dirs(self.store)
        for directory in directories:
            self._hour(directory, now, result)
        self._cleaned &= self._seen  # forget outputs that are gone
        alive = {str(d) for d in directories}
        with self._mutex:  # hours removed by retention (or by hand)
            self._merged = {p for p in self._merged if str(p.parent) in alive}
        self._fast_idle = {d: m for d, m in list(self._fast_idle.items()) if str(d) in alive}
        self._records = {k: v for k, v in list(self._records.items())
                         if os.path.dirname(k) in alive and os.path.exists(k)}
        self.last = result
        with self._mutex:
            self.passes += 1
            idle = result.merges == 0 and self.total_merges == merges_before  # the fast lane merged nothing either
            self.total_merges += result.merges
            if not idle:
                self.idle_since = None
            elif self.idle_since is None:
                self.idle_since = now
        self.removed_hours += len(result.removed_hours)
        self.last_pass_s = now
        took = time.perf_counter() - t_pass
        self.figures["pass_s"] += took
        self.figures["max_pass_s"] = max(self.figures["max_pass_s"], took)
        self._write_state(now, result)
        return result

    def _write_state(self, now: float, result: PassResult) -> None:
        """STORE/compaction.json: the policy and the last pass, for `tailscope store` (best effort)."""
        state = {"pid": os.getpid(), "last_pass_ns": int(now * 1e9), "policy": asdict(self.policy),
                 "retention": self.retention_text, "merges": result.merges, "files": result.files,
                 "hours": result.hours, "max_files_per_hour": result.max_files_per_hour,
                 "pending_hours": result.pending_hours, "removed_hours": self.removed_hours,
                 "quarantined": len(result.quarantined), "failed": result.failed, "passes": self.passes,
                 "total_merges": self.total_merges, "figures": self.figures}
        tmp = self.store / f".{COMPACTION_STATE}.{os.getpid()}.tmp"
        try:
            tmp.write_text(json.dumps(state), encoding="utf-8")
            os.replace(tmp, self.store / COMPACTION_STATE)
        except OSError:
            tmp.unlink(missing_ok=True)

    def run(self, stop: Any, every_s: float = 2.0) -> None:
        """Pass after pass until `stop` (a threading.Event) is set; a failure is one line, then the next pass.

        Two lanes: this thread's passes (every level, settled hours, deletions, retention) and, once the lock
        is held, a fast lane (`fast_pass`) that merges only the lowest levels, so the file count of an hour
        stays bounded while a long merge runs. At the process's own CPU priority: a lower one (nice 10 on the
        thread) let a busy machine starve it (docs/benchmarks.md, "compaction")."""
        fast: threading.Thread | None = None
        while not stop.is_set():
            try:
                self.acquire()
                if fast is None and self.merge and self.policy.lanes > 1:
                    fast = threading.Thread(target=self._run_fast, args=(stop, every_s), daemon=True,
                                            name="tailscope-compact-fast")
                    fast.start()
                self.run_once()
            except CompactorBusy as exc:
                self.say(f"compact: {exc}")
                stop.wait(60.0)
                continue
            except Exception as exc:  # the receiver must not die of a merge
                self.say(f"compact: pass failed ({_first_line(exc)}); will retry")
            stop.wait(every_s)
        if fast is not None:
            fast.join()
        self.release()

    def _run_fast(self, stop: Any, every_s: float) -> None:
        while not stop.is_set():
            try:
                merged = self.fast_pass()
            except Exception as exc:  # the receiver must not die of a merge
                self.say(f"compact: fast pass failed ({_first_line(exc)}); will retry")
                merged = 0
            if not merged:
                stop.wait(min(every_s, FAST_WAIT_S))

    def fast_pass(self, now: float | None = None) -> int:
        """One merge of the lowest levels (< FAST_LEVELS) in each hour that has one to do, newest hour first;
        the number of merges. Hours unchanged since they last had nothing to do are skipped (a stat each)."""
        now = self.clock() if now is None else now
        if now < self._retry_at:
            return 0
        result = PassResult()
        for directory in reversed(hour_dirs(self.store)):
            try:
                mtime = directory.stat().st_mtime_ns
            except FileNotFoundError:
                continue
            if self._fast_idle.get(directory) == mtime:
                continue
            listing = self._list(directory)
            plan = self.plan(listing, now, levels=FAST_LEVELS)
            if not plan:
                self._fast_idle[directory] = mtime
                continue
            self._fast_idle.pop(directory, None)
            self._claim_and_merge(listing, plan, result, now)
        with self._mutex:
            self.total_merges += result.merges
            if result.merges:
                self.idle_since = None
        return result.merges

    def _list(self, directory: Path) -> HourListing:
        t0 = time.perf_counter()
        try:
            return list_hour(directory, self._records)
        finally:
            self._figure("list_s", time.perf_counter() - t0)

    def _figure(self, key: str, seconds: float, level: int | None = None, inputs: int = 0) -> None:
        with self._mutex:
            f = self.figures
            f[key] += seconds
            if level is not None:
                k = str(level)
                f["merges_by_level"][k] = f["merges_by_level"].get(k, 0) + 1
                f["merge_s_by_level"][k] = f["merge_s_by_level"].get(k, 0.0) + seconds
                f["inputs_by_level"][k] = f["inputs_by_level"].get(k, 0) + inputs

    def _hour(self, directory: Path, now: float, result: PassResult) -> None:
        listing = self._list(directory)
        self._delete_replaced(listing, now, result)
        for _ in range(10_000):  # each merge leaves fewer files: bounded
            t0 = time.perf_counter()
            plan = self.plan(listing, now) if self.merge else []
            self._figure("plan_s", time.perf_counter() - t0)
            if not plan or now < self._retry_at:
                break
            if not self._claim_and_merge(listing, plan, result, now):
                break
            listing = self._list(directory)
        if listing.files:
            result.hours += 1
            result.files += len(listing.files)
            result.max_files_per_hour = max(result.max_files_per_hour, len(listing.files))
            if self.settled(listing, now) and self._small(listing):
                result.pending_hours += 1

    # --- planning ------------------------------------------------------------------------

    def _sizes(self, listing: HourListing) -> dict[Path, os.stat_result]:
        out = {}
        for f in listing.files:
            try:
                out[f] = f.stat()
            except FileNotFoundError:
                continue
        return out

    def settled(self, listing: HourListing, now: float) -> bool:
        """The hour ended `settle_s` ago and no segment landed in it for `quiet_s`."""
        end_s = (hour_of_dir(listing.directory) + HOUR_NS) / 1e9
        if now - end_s < self.policy.settle_s:
            return False
        return now - self._newest_ns(listing.files, self._sizes(listing)) / 1e9 >= self.policy.quiet_s

    def _newest_ns(self, files: list[Path], stats: dict[Path, os.stat_result]) -> int:
        """When the newest segment a writer made among `files` (or among the inputs of the merged ones) landed:
        compaction's own outputs are not "new spans landing", and an hour whose writers' segments are all merged
        already is not quiet for that."""
        newest = 0
        for f in files:
            if segment_level(f.name) == 0:
                st = stats.get(f)
                newest = max(newest, st.st_mtime_ns if st is not None else 0)
                continue
            record = self._records.get(str(f)) or read_record(f) or {}
            newest = max(newest, int(record.get("newest_ns", record.get("committed_ns", 0))))
        return newest

    def _small(self, listing: HourListing) -> list[Path]:
        """Segments still to merge once the hour settles: below half the target, or never sorted (level 0)."""
        stats = self._sizes(listing)
        small = [f for f, st in stats.items() if st.st_size < self.target // 2]
        big_raw = [f for f, st in stats.items()
                   if st.st_size >= self.target // 2 and segment_level(f.name) == 0]
        if len(small) == 1 and segment_level(small[0].name) > 0:
            small = []  # one sorted file: nothing to gain
        return small + [f for f in big_raw if stats[f].st_size <= 2 * self.target]

    def plan(self, listing: HourListing, now: float, levels: int | None = None) -> list[Path]:
        """The inputs of the next merge in this hour (oldest first), or [] when the hour is in shape; segments
        another lane merges now are left out. `levels`: only merges of levels below it, while the hour is
        written (the fast lane)."""
        stats = self._sizes(listing)
        with self._mutex:
            busy = set(self._busy)
        for f in busy.intersection(stats):
            del stats[f]
        half = self.target // 2
        if self.settled(listing, now):
            if levels is not None:
                return []
            todo = sorted((f for f in self._small(listing) if f in stats),
                          key=lambda f: (stats[f].st_size, f.name))  # smallest first
            group = self._fill(todo, stats)
            if len(group) == 1 and segment_level(group[0].name) > 0:  # one sorted file alone: nothing to gain,
                group = [f for f in todo if segment_level(f.name) == 0][:1]  # but a raw one is rewritten sorted
            return group
        by_level: dict[int, list[Path]] = {}
        for f, st in stats.items():
            if st.st_size < half and (levels is None or segment_level(f.name) < levels):
                by_level.setdefault(segment_level(f.name), []).append(f)
        backlog = max(map(len, by_level.values()), default=0)
        if backlog > self.figures["max_backlog"]:
            self.figures["max_backlog"] = backlog
        for level in sorted(by_level):
            files = sorted(by_level[level], key=lambda f: (stats[f].st_mtime, f.name))
            if len(files) >= self.policy.fan_in:
                # fan_in at a time; after a backlog (segments that landed during a long merge) all of the level's
                # whole groups at once, up to CATCH_UP groups: one merge catches up instead of several passes
                groups = min(len(files) // self.policy.fan_in, CATCH_UP)
                return self._fill(files[:groups * self.policy.fan_in], stats)
        return []

    def _fill(self, files: list[Path], stats: dict[Path, os.stat_result]) -> list[Path]:
        """The longest prefix of `files` whose bytes stay within the target (at least one file): what one merge
        reads, so its memory stays bounded."""
        out: list[Path] = []
        total = 0
        for f in files:
            if out and (total + stats[f].st_size > self.target or len(out) >= MAX_INPUTS):
                break
            out.append(f)
            total += stats[f].st_size
        return out

    # --- a merge -------------------------------------------------------------------------

    def _quarantine(self, path: Path, exc: BaseException, result: PassResult) -> None:
        """Move an unreadable segment to STORE/quarantine/dt=…/hr=…/ (never deleted) and say so."""
        target_dir = self.store / QUARANTINE_DIR / path.parent.parent.name / path.parent.name
        target_dir.mkdir(parents=True, exist_ok=True)
        target = target_dir / path.name
        os.replace(path, target)
        if self.policy.durable:
            fsync_path(target_dir)
            fsync_path(path.parent)
        result.quarantined.append(target)
        self.say(f"compact: {path} is not a readable segment ({_first_line(exc)}); moved to {target}")

    def _claim_and_merge(self, listing: HourListing, inputs: list[Path], result: PassResult, now: float) -> bool:
        """Merge `inputs` unless another lane merges one of them now or merged one since `listing` was taken.

        Every merge of this store is this process's (the lock): a merge's inputs join `_merged` when it commits,
        before they leave `_busy`, and leave `_merged` only once deleted, so a plan made from a listing taken
        before another lane's commit is refused here, never merged twice."""
        with self._mutex:
            if self._busy.intersection(inputs) or self._merged.intersection(inputs):
                return False
            self._busy.update(inputs)
        try:
            return self._merge(listing, inputs, result, now)
        finally:
            with self._mutex:
                self._busy.difference_update(inputs)

    def _merge(self, listing: HourListing, inputs: list[Path], result: PassResult, now: float) -> bool:
        """Merge `inputs` into one sorted segment of the next level; False when nothing was written."""
        for path in inputs:  # every footer first: a segment that is not Parquet goes to quarantine
            try:
                pq.read_metadata(path)
            except FileNotFoundError:
                return False  # gone meanwhile (another tool): plan again at the next pass
            except pa.ArrowException as exc:  # not Parquet, truncated, a bad footer
                self._quarantine(path, exc, result)
                return True  # the hour changed: plan again
            except OSError as exc:  # the disk, not the file: leave it and retry later
                self._fail(path, exc, result, now)
                return False
        level = max(segment_level(p.name) for p in inputs) + 1
        name = f"c{level}-{uuid.uuid4().hex[:16]}.parquet"
        directory = listing.directory
        final = directory / name
        tmp = directory / f".{name}.ctmp"
        record_path = final.with_suffix(RECORD_SUFFIX)
        record_tmp = directory / f".{record_path.name}.ctmp"
        t0 = time.perf_counter()
        try:
            newest_ns = self._newest_ns(inputs, self._sizes(listing))
            spans = self._write(inputs, tmp)
            t1 = time.perf_counter()
            record = {"inputs": [p.name for p in inputs], "level": level, "spans": spans, "newest_ns": newest_ns,
                      "digest": f"{combine_digests(listing.digests[p.name] for p in inputs):032x}",
                      "committed_ns": int(now * 1e9)}  # the pass's time: grace is counted on the same clock
            with open(record_tmp, "w", encoding="utf-8") as fh:
                fh.write(json.dumps(record))
                if self.policy.durable:
                    fh.flush()
                    os.fsync(fh.fileno())
            os.replace(record_tmp, record_path)  # not yet in force: its segment has no name yet
            if self.policy.durable:
                fsync_path(directory)
            os.replace(tmp, final)  # the commit: readers now see `final` and not the inputs
            with self._mutex:
                self._merged.update(inputs)
            if self.policy.durable:
                fsync_path(directory)
        except (OSError, duckdb.Error) as exc:
            for p in (tmp, record_tmp):
                p.unlink(missing_ok=True)
            if not final.exists():
                record_path.unlink(missing_ok=True)
                if isinstance(exc, duckdb.OutOfMemoryException) and len(inputs) > 2:  # fewer at once, now
                    self.say(f"compact: a merge of {len(inputs)} segments in {directory} ran out of memory; "
                             f"merging {len(inputs) // 2} of them")
                    return self._merge(listing, inputs[:len(inputs) // 2], result, now)
            self._fail(directory, exc, result, now)
            return False
        t2 = time.perf_counter()
        self._figure("write_s", t1 - t0)
        self._figure("commit_s", t2 - t1, level, len(inputs))
        result.merges += 1
        result.merged_segments += len(inputs)
        result.written_spans += spans
        return True

    def _write(self, inputs: list[Path], path: Path) -> int:
        """Write the spans of `inputs`, sorted by start time, to `path` (fsynced); return how many.

        DuckDB sorts within the policy's memory_mib, spilling to STORE/.compact-tmp/ beyond it, so a merge's memory
        stays bounded whatever the target size; columns a segment lacks (written before them) come out NULL."""
        con = self._database().cursor()
        try:
            files = [str(p) for p in inputs]
            order = "ORDER BY TimestampNs" if "TimestampNs" in pq.read_schema(inputs[0]).names else ""
            row = con.execute(f"COPY (SELECT * FROM read_parquet(?, union_by_name = true, hive_partitioning = false) "
                              f"{order}) TO '{path}' (FORMAT parquet, COMPRESSION zstd, "
                              f"ROW_GROUP_SIZE {int(self.policy.row_group_spans)})", [files]).fetchone()
        finally:
            con.close()
        if self.policy.durable:
            fsync_path(path)
        return int(row[0]) if row else 0

    def _database(self) -> duckdb.DuckDBPyConnection:
        """The merges' DuckDB database, one for every lane: its memory limit (`memory_mib` less what DuckDB uses
        beyond its limit) bounds them all, one thread each, and sorts beyond it spill to STORE/.compact-tmp/."""
        with self._mutex:
            if self._db is None:
                self._db = duckdb.connect(":memory:", config={
                    "memory_limit": f"{self.policy.memory_mib - DUCKDB_OVERHEAD_MIB}MiB", "threads": 1,
                    "temp_directory": str(self.store / SPILL_DIR), "preserve_insertion_order": False})
            return self._db

    def _fail(self, where: Path, exc: BaseException, result: PassResult, now: float) -> None:
        result.failed += 1
        self._retry_at = now + self.policy.retry_s
        self.say(f"compact: could not merge in {where} ({_first_line(exc)}); the segments stay as they are, "
                 f"retrying in {self.policy.retry_s:.0f} s")

    # --- deleting what was merged ---------------------------------------------------------

    def _delete_replaced(self, listing: HourListing, now: float, result: PassResult) -> None:
        """Delete the inputs of merges committed more than `grace_s` ago (each input's own inputs first)."""
        if not listing.replaced:
            return
        cutoff_ns = (now - self.policy.grace_s) * 1e9
        for out in listing.files:
            if not COMPACTED.match(out.name):
                continue
            self._seen.add(out)
            if out in self._cleaned:
                continue
            record = read_record(out)
            if record is None or record.get("committed_ns", 0) > cutoff_ns:
                continue
            for name in record.get("inputs", ()):
                result.deleted += self._delete_tree(listing.directory / name)
            self._cleaned.add(out)
        if result.deleted and self.policy.durable:
            fsync_path(listing.directory)

    def _delete_tree(self, path: Path, depth: int = 0) -> int:
        """Delete a replaced segment, and first, when it is a compacted one, whatever it replaced itself."""
        n = 0
        if COMPACTED.match(path.name) and depth < 64:
            record = read_record(path)
            for name in (record or {}).get("inputs", ()):
                n += self._delete_tree(path.parent / name, depth + 1)
        try:
            path.unlink()
            n += 1
        except FileNotFoundError:
            pass
        with self._mutex:
            self._merged.discard(path)
        if COMPACTED.match(path.name):
            path.with_suffix(RECORD_SUFFIX).unlink(missing_ok=True)
            self._records.pop(str(path), None)
        return n


def make_compactor(store: Path, policy: Policy, keep: R.Retention, *, say: Callable[[str], None],
                   on_removed: Callable[[int], None] | None = None,
                   extra_bytes: Callable[[int], int] | None = None, merge: bool = True) -> Compactor:
    """A compactor of `store` that also applies `keep` at every pass (`on_removed(hour_ns)` after each hour
    removed; `extra_bytes(hour_ns)`: the bytes of an hour's materialized requests, counted toward the size limit)."""
    apply = partial(R.apply, store, keep, on_removed=on_removed, extra_bytes=extra_bytes) if keep.active else None
    return Compactor(store, policy, say=say, retention=apply, retention_text=keep.describe(), merge=merge)


def start_background(compactor: Compactor, every_s: float) -> tuple[threading.Thread, threading.Event]:
    """Run `compactor` pass after pass on a daemon thread; set the event to stop it."""
    stop = threading.Event()
    thread = threading.Thread(target=compactor.run, args=(stop, every_s), name="tailscope-compact", daemon=True)
    thread.start()
    return thread, stop
