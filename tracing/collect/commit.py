"""Group commit: requests queue decoded tables, one thread writes them as one durable segment.

A request is answered only after the segment holding its spans is fsynced and renamed
into place (file and directory fsynced), so a 200 survives kill -9. While one group is
being written, newly arriving requests gather into the next group: the added latency is
about one segment write, and throughput grows with concurrency instead of shrinking.
The queue is bounded in spans; `submit` raises `QueueFull` instead of growing it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tracing import schema as S
from tracing.store import SegmentWriter, segment_files


class QueueFull(Exception):
    """The write queue holds its maximum of spans; the client should retry later."""


class Closed(Exception):
    """The committer is stopping and takes no new work."""


@dataclass(frozen=True)
class CommitResult:
    """What one request's group commit did: spans stored, spans dropped as already stored."""

    stored: int
    duplicates: int
    segments: int


def _keys(table: pa.Table) -> list[str]:
    return pc.binary_join_element_wise(table.column("TraceId"), table.column("SpanId"), "").to_pylist()


class RecentKeys:
    """A bounded set of (TraceId, SpanId) keys of recently stored spans, oldest evicted first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._set: set[str] = set()
        self._chunks: deque[list[str]] = deque()
        self._size = 0

    def __len__(self) -> int:
        return len(self._set)

    def __contains__(self, key: object) -> bool:
        return key in self._set

    def add(self, keys: list[str]) -> None:
        """Remember `keys` (already free of duplicates), evicting the oldest beyond capacity."""
        if self.capacity == 0 or not keys:
            return
        self._set.update(keys)
        self._chunks.append(keys)
        self._size += len(keys)
        while self._size > self.capacity and self._chunks:
            old = self._chunks.popleft()
            self._size -= len(old)
            self._set.difference_update(old)

    def filter(self, table: pa.Table) -> tuple[pa.Table, list[str]]:
        """`table` without spans already remembered or repeated within it, and the kept keys."""
        keys = _keys(table)
        unique = set(keys)
        if len(unique) == len(keys) and self._set.isdisjoint(unique):
            return table, keys
        seen = self._set
        batch_seen: set[str] = set()
        mask = []
        kept: list[str] = []
        for key in keys:
            keep = key not in seen and key not in batch_seen
            if keep:
                batch_seen.add(key)
                kept.append(key)
            mask.append(keep)
        return table.filter(pa.array(mask, pa.bool_())), kept

    def load(self, store: Path, max_age_s: float) -> int:
        """Remember the keys of segments modified in the last `max_age_s` seconds (newest first)."""
        if self.capacity == 0:
            return 0
        cutoff = time.time() - max_age_s
        recent = []
        for path in segment_files(store):
            try:
                mtime = path.stat().st_mtime
            except FileNotFoundError:
                continue
            if mtime >= cutoff:
                recent.append((mtime, path))
        chunks: list[list[str]] = []
        total = 0
        for _, path in sorted(recent, reverse=True):
            if total >= self.capacity:
                break
            try:
                table = pq.read_table(path, columns=["TraceId", "SpanId"])
            except (OSError, pa.ArrowException):
                continue
            keys = _keys(table)
            chunks.append(keys)
            total += len(keys)
        for keys in reversed(chunks):  # oldest first, so the newest survive eviction
            self.add(keys)
        return total


@dataclass
class _Pending:
    table: pa.Table
    future: Future[CommitResult]
    queued_at: float


class Committer:
    """The one writer thread: takes every queued table, writes one segment, resolves futures.

    `prepare` turns the concatenated group into SPAN_SCHEMA (the receiver promotes and
    normalizes there, so per-request work stays small).
    """

    def __init__(self, writer: SegmentWriter, keys: RecentKeys, *, max_queue_spans: int,
                 max_batch_spans: int, prepare: Callable[[pa.Table], pa.Table] | None = None) -> None:
        self.writer = writer
        self.keys = keys
        self.max_queue_spans = max_queue_spans
        self.max_batch_spans = max_batch_spans
        self._prepare = prepare
        self._cond = threading.Condition()
        self._pending: deque[_Pending] = deque()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="tailscope-commit", daemon=True)
        # statistics (read by the progress line; written under the condition's lock)
        self.queued_spans = 0
        self.stored_spans = 0
        self.duplicate_spans = 0
        self.segments = 0
        self.commits = 0
        self.failed_commits = 0
        #: seconds from submit to durable, one sample per request (the last 100,000)
        self.latencies: deque[float] = deque(maxlen=100_000)
        #: seconds spent writing each group commit (the last 10,000)
        self.write_seconds: deque[float] = deque(maxlen=10_000)

    def start(self) -> None:
        """Start the writer thread."""
        self._thread.start()

    def submit(self, table: pa.Table) -> Future[CommitResult]:
        """Queue `table` for the next group commit; the future resolves once it is durable."""
        future: Future[CommitResult] = Future()
        n = table.num_rows
        with self._cond:
            if self._closing:
                raise Closed("the receiver is shutting down")
            if self.queued_spans and self.queued_spans + n > self.max_queue_spans:
                raise QueueFull(f"write queue full ({self.queued_spans} spans waiting, limit "
                                f"{self.max_queue_spans})")
            self.queued_spans += n
            self._pending.append(_Pending(table, future, time.perf_counter()))
            self._cond.notify()
        return future

    def close(self, timeout: float | None = None) -> None:
        """Take no new work, write everything queued, then stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _take(self) -> list[_Pending] | None:
        with self._cond:
            while not self._pending and not self._closing:
                self._cond.wait()
            if not self._pending:
                return None
            group = [self._pending.popleft()]
            size = group[0].table.num_rows
            while self._pending and size + self._pending[0].table.num_rows <= self.max_batch_spans:
                item = self._pending.popleft()
                size += item.table.num_rows
                group.append(item)
            return group

    def _run(self) -> None:
        while True:
            group = self._take()
            if group is None:
                return
            self._commit(group)

    def _commit(self, group: list[_Pending]) -> None:
        n_in = sum(item.table.num_rows for item in group)
        started = time.perf_counter()
        try:
            tables = [item.table for item in group]
            table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
            if self._prepare is not None:  # promotion and engine normalization, once per group
                table = self._prepare(table)
            if table.schema != S.SPAN_SCHEMA:
                table = table.select(list(S.COLUMN_NAMES)).cast(S.SPAN_SCHEMA)
            kept, keys = self.keys.filter(table)
            # one chunk per column: Parquet encodes it about twice as fast as hundreds of small chunks
            paths = self.writer.write(kept.combine_chunks())
            self.keys.add(keys)
        except BaseException as exc:  # a failed write fails every request of the group (503, retried)
            with self._cond:
                self.queued_spans -= n_in
                self.failed_commits += 1
            for item in group:
                item.future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        done = time.perf_counter()
        dups = table.num_rows - kept.num_rows
        with self._cond:
            self.queued_spans -= n_in
            self.stored_spans += kept.num_rows
            self.duplicate_spans += dups
            self.segments += len(paths)
            self.commits += 1
            self.write_seconds.append(done - started)
            for item in group:
                self.latencies.append(done - item.queued_at)
        result = CommitResult(stored=kept.num_rows, duplicates=dups, segments=len(paths))
        for item in group:
            item.future.set_result(result)
