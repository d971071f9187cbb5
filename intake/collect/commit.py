"""Group commit: requests queue decoded tables, one thread writes them as one durable segment.

A request is answered only after the segment holding its spans is fsynced and renamed
into place (file and directory fsynced), or, while several clients send, after its body is
fsynced in the journal (intake/collect/journal.py; replayed at the next start), so a 200
survives kill -9. While one group is
being written, newly arriving requests gather into the next group: the added latency is
about one segment write, and throughput grows with concurrency instead of shrinking.
The queue is bounded in spans; `submit` raises `QueueFull` instead of growing it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from prometheus_client import Histogram

from intake.collect.journal import Journal
from tracing import schema as S
from tracing.errors import RetryLater
from tracing.store import SegmentWriter, segment_files

#: Buckets of the receiver's commit latency on /metrics (seconds, submit to durable).
COMMIT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

_log = logging.getLogger(__name__)


class QueueFull(RetryLater):
    """The write queue holds its maximum of spans; the client should retry later."""


class Closed(RetryLater):
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

    def discard(self, keys: list[str]) -> None:
        """Forget `keys` (their write failed, so a re-send must be stored)."""
        self._set.difference_update(keys)

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
    table: pa.Table | None  # None: the spans are in the committer's columnar builder
    spans: int
    future: Future[CommitResult]
    queued_at: float
    early: bool = False  # answered once journalled (not once in a segment)
    gen: int = 0  # the journal generation (segment group) it belongs to
    body: bytes | None = None  # the protobuf body to journal (None: `table` is journalled)
    peer: str | None = None
    resolved: bool = False  # its future is answered (under the committer's condition)


@dataclass
class _Prepared:
    group: list[_Pending]
    kept: pa.Table
    keys: list[str]
    duplicates: int
    failures: int  # failed writes seen when the group was checked for duplicates
    started: float
    gen: int = -1  # every journal generation up to this one is in this group


class Builder(Protocol):
    """The columnar accumulator of intake._otlpx (add a protobuf body, take all columns)."""

    spans: int

    def add(self, data: bytes, room: int = -1, peer: str | None = None) -> int | None: ...

    def take(self) -> dict[str, Any]: ...


class Committer:
    """The one writer thread: takes every queued table, writes one segment, resolves futures.

    `prepare` turns the concatenated group into SPAN_SCHEMA (the receiver promotes and
    normalizes there, so per-request work stays small). With a `builder` (intake._otlpx),
    protobuf bodies are extracted into one set of columns that `assemble` turns into one
    table per group, instead of one table per request.
    """

    def __init__(self, writer: SegmentWriter, keys: RecentKeys, *, max_queue_spans: int,
                 prepare: Callable[[pa.Table], pa.Table] | None = None, builder: Builder | None = None,
                 assemble: Callable[[dict[str, Any]], pa.Table] | None = None,
                 gather_spans: int = 0, gather_s: float = 0.0,
                 senders: Callable[[], int] | None = None,
                 on_stored: Callable[[pa.Table], None] | None = None,
                 journal: Journal | None = None, journal_s: float = 0.0, segment_spans: int = 0) -> None:
        self.writer = writer
        self.keys = keys
        self.max_queue_spans = max_queue_spans
        self._prepare = prepare
        self._builder = builder if assemble is not None else None
        self._assemble = assemble
        self._cond = threading.Condition()
        self._pending: deque[_Pending] = deque()
        self._pending_spans = 0
        # gathering: a group commit costs ~8 ms of fixed work (promotion, Parquet encoders, fsync)
        # whatever its size, so while several clients are sending (senders() > 1) a group is taken
        # at most once per gather_s unless gather_spans are waiting; a lone client, or a request
        # after a quiet spell, is taken at once (see docs/collect.md "Group commits")
        self.gather_spans = gather_spans
        self.gather_s = gather_s
        self.senders = senders
        #: called with each group's stored spans once they are durable (the forwarder's queue); must not block
        self.on_stored = on_stored
        self._last_take = 0.0
        self._closing = False
        # the journal (see intake/collect/journal.py): while several clients send, a request is answered
        # once its bytes are fsynced there, and a group is taken when segment_spans wait or the oldest
        # waited journal_s, so segments are few and large; a lone client is answered after the segment
        self.journal = journal
        self.journal_s = journal_s
        self.segment_spans = segment_spans
        self._gen = 0
        self._gen_started_ns = time.time_ns()
        self._covered = -1  # every generation up to this one is in fsynced segments
        self._journal_frozen = False  # a group with answered spans was lost: keep every file for replay
        self._journal_queue: deque[_Pending] = deque()
        self._journal_stop = False
        self._dropped_gen = -1  # journal thread: generations whose files it deleted
        self._gen_starts: dict[int, int] = {0: self._gen_started_ns}  # generation -> wall ns it began
        self._group_gen = -1
        self._direct = 0  # pending requests answered only once in a segment
        self.journalled_requests = 0
        self._journal_thread = threading.Thread(target=self._journal_loop, name="tailscope-journal", daemon=True)
        self._thread = threading.Thread(target=self._run, name="tailscope-prepare", daemon=True)
        # two threads, one group at a time: the next group is taken only once the writer has written
        # and fsynced the previous one, so everything that arrived meanwhile joins it. Overlapping the
        # two (building a group while the previous one is written) made more, smaller groups, each
        # with its fixed cost: with 8 clients of 512-span bodies ~1,600 spans a group against ~2,200,
        # and 25 % more receiver CPU per span at no better rate on 2 shared cores (docs/benchmarks.md).
        # The writer stays a thread of its own so a failed write is handled in one place.
        self._handoff: queue.Queue[_Prepared | None] = queue.Queue(maxsize=1)
        self._taken = threading.Event()
        self._writer_thread = threading.Thread(target=self._write_loop, name="tailscope-write", daemon=True)
        self._keys_lock = threading.Lock()
        self._builder_lock = threading.Lock()
        # statistics (read by the progress line; written under the condition's lock)
        self.queued_spans = 0
        self.stored_spans = 0
        self.duplicate_spans = 0
        self.segments = 0
        self.commits = 0
        self.groups = 0
        self.failed_commits = 0
        self._write_failures = 0
        #: seconds from submit to durable, one sample per request (the last 100,000)
        self.latencies: deque[float] = deque(maxlen=100_000)
        self.latency_histogram = Histogram(
            "tailscope_receiver_commit_latency_seconds", "Time from a request's spans being queued to their being "
            "durable (journal or segment).", buckets=COMMIT_BUCKETS_S, registry=None)  # on /metrics
        #: seconds spent writing each group commit (the last 10,000)
        self.write_seconds: deque[float] = deque(maxlen=10_000)

    @property
    def columnar(self) -> bool:
        """True when protobuf bodies go through the C builder (its extraction runs without the GIL)."""
        return self._builder is not None

    def _latency(self, seconds: float) -> None:
        """Keep one request's submit-to-durable time (the progress line's p99 and the /metrics histogram)."""
        self.latencies.append(seconds)
        self.latency_histogram.observe(seconds)

    def start(self) -> None:
        """Start the commit threads."""
        self._thread.start()
        self._writer_thread.start()
        if self.journal is not None:
            self._journal_thread.start()

    def _queue(self, item: _Pending, journal: bool) -> None:
        """Queue `item` (under the condition): journalled while several clients send, else direct."""
        item.gen = self._gen
        if journal and self.journal is not None and self.journal_s > 0:
            item.early = True
            self._journal_queue.append(item)
        else:
            self._direct += 1
        self.queued_spans += item.spans
        self._pending.append(item)
        self._pending_spans += item.spans
        self._cond.notify_all()

    def _check_room(self, n: int) -> None:
        if self._closing:
            raise Closed("the receiver is shutting down")
        if self.queued_spans and self.queued_spans + n > self.max_queue_spans:
            raise QueueFull(f"write queue full ({self.queued_spans} spans waiting, limit {self.max_queue_spans})")

    def submit(self, table: pa.Table, *, journal: bool = False) -> Future[CommitResult]:
        """Queue `table` for the next group commit; the future resolves once it is durable (in the
        journal when `journal` and the committer has one, else in a segment)."""
        future: Future[CommitResult] = Future()
        n = table.num_rows
        with self._cond:
            self._check_room(n)
            self._queue(_Pending(table, n, future, time.perf_counter()), journal)
        return future

    def submit_protobuf(self, data: bytes, peer: str | None = None, *,
                        journal: bool = False) -> tuple[int, Future[CommitResult]] | None:
        """Queue a protobuf body through the columnar builder: (spans, future), or None when the
        body needs the Python decoder (then nothing was queued). `peer` goes on every resource as
        `tailscope.peer` (intake.peer.with_peer, in C). Raises QueueFull or Closed."""
        if self._builder is None:
            return None
        future: Future[CommitResult] = Future()
        # the builder's own lock, not the condition: the C extraction runs without the GIL, and the journal
        # and writer threads go on meanwhile; a group is taken under both (see _take), so a body is either
        # extracted and queued before a take or after it
        with self._builder_lock:
            with self._cond:
                self._check_room(1)
                room = self.max_queue_spans - self.queued_spans if self.queued_spans else -1
            n = self._builder.add(data, room, peer)
            if n is None:
                return None
            with self._cond:
                if n < 0:
                    raise QueueFull(f"write queue full ({self.queued_spans} spans waiting, "
                                    f"limit {self.max_queue_spans})")
                if n == 0:  # an empty request (valid OTLP): nothing to store, answered at once
                    future.set_result(CommitResult(stored=0, duplicates=0, segments=0))
                    return 0, future
                self._queue(_Pending(None, n, future, time.perf_counter(), body=data, peer=peer), journal)
        return n, future

    def close(self, timeout: float | None = None) -> None:
        """Take no new work, write everything queued, then stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._writer_thread.is_alive():
            self._writer_thread.join(timeout)
        with self._cond:
            self._journal_stop = True
            self._cond.notify_all()
        if self._journal_thread.is_alive():
            self._journal_thread.join(timeout)

    def _take(self) -> tuple[list[_Pending], dict[str, Any] | None] | None:
        with self._cond:
            while not self._pending and not self._closing:
                self._cond.wait()
            if not self._pending:
                return None
            while not self._closing and not self._direct:  # only journalled requests: gather a large group
                left = self.journal_s - (time.perf_counter() - self._pending[0].queued_at)
                if self._pending_spans >= self.segment_spans or left <= 0:
                    break
                self._cond.wait(left)
            if self._direct and self.senders is not None and self.senders() > 1:
                deadline = self._last_take + self.gather_s
                while (not self._closing and self._pending_spans < self.gather_spans
                       and (left := deadline - time.perf_counter()) > 0):
                    self._cond.wait(left)
        with self._builder_lock, self._cond:  # no body half-way between extraction and the queue
            self._last_take = time.perf_counter()
            group = list(self._pending)  # everything queued: the queue bound also bounds a group
            self._pending.clear()
            self._pending_spans = 0
            self._direct = 0
            self.groups += 1
            self._group_gen = self._gen  # later requests belong to the next generation (journal file)
            self._gen += 1
            self._gen_started_ns = time.time_ns()
            self._gen_starts[self._gen] = self._gen_started_ns
            for old in [g for g in self._gen_starts if g < self._gen - 4096]:
                del self._gen_starts[old]
            columns = self._builder.take() if self._builder is not None and self._builder.spans else None
            return group, columns

    def _run(self) -> None:
        """Stage 1: take a group, build and promote its table, drop duplicates; hand it to stage 2."""
        try:
            while True:
                taken = self._take()
                if taken is None:
                    return
                prepared = self._prepare_group(*taken)
                if prepared is not None:
                    self._handoff.put(prepared)
                    self._taken.wait()  # until the writer has written it (see __init__)
                    self._taken.clear()
        finally:
            self._handoff.put(None)

    def _prepare_group(self, group: list[_Pending], columns: dict[str, Any] | None) -> _Prepared | None:
        started = time.perf_counter()
        try:
            tables = [item.table for item in group if item.table is not None]
            if columns is not None and self._assemble is not None:
                tables.insert(0, self._assemble(columns))
            gen = self._group_gen
            if not tables:  # only empty requests in this group: nothing to write
                self._resolve(group, CommitResult(stored=0, duplicates=0, segments=0))
                self._cover(gen)
                return None
            table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
            if self._prepare is not None:  # promotion and engine normalization, once per group
                table = self._prepare(table)
            if table.schema != S.SPAN_SCHEMA:
                table = table.select(list(S.COLUMN_NAMES)).cast(S.SPAN_SCHEMA)
            with self._keys_lock:
                kept, keys = self.keys.filter(table)
                self.keys.add(keys)  # taken back if the write fails
                failures = self._write_failures
            # one chunk per column: Parquet encodes it about twice as fast as hundreds of small chunks
            return _Prepared(group, kept.combine_chunks(), keys, table.num_rows - kept.num_rows, failures, started,
                             gen)
        except Exception as exc:
            with self._cond:
                if any(item.early and item.resolved for item in group):
                    self._journal_frozen = True  # answered spans stay in the journal for the next start
            self._fail(group, exc)
            self._cover(self._group_gen)
            return None

    def _write_loop(self) -> None:
        """Stage 2: write and fsync each prepared group, then answer its requests."""
        while True:
            prepared = self._handoff.get()
            if prepared is None:
                self._taken.set()
                return
            try:
                self._write(prepared)
            finally:
                self._taken.set()  # the next group is taken now (see __init__)

    def _write(self, p: _Prepared) -> None:
        with self._keys_lock:
            stale = p.failures != self._write_failures
        if stale:
            # an earlier write failed after this group was checked against its keys: this group may have
            # dropped spans as duplicates of ones that were never stored
            self._lost(p, OSError("an earlier segment write failed; retry"))
            return
        while True:
            try:
                paths = self.writer.write(p.kept)
                break
            except Exception as exc:  # a failed write fails every request of the group (503, retried)
                with self._cond:
                    answered = any(item.early and item.resolved for item in p.group)
                    closing = self._closing
                if answered and not closing:
                    # some of these spans were answered 200 from the journal: retry (the queue fills meanwhile
                    # and new requests get 503) rather than lose them until the next start's replay
                    _log.warning("segment write failed, retrying: %s", exc)
                    time.sleep(0.5)
                    continue
                self._lost(p, exc)
                return
        done = time.perf_counter()
        with self._cond:
            self.queued_spans -= sum(item.spans for item in p.group)
            self.stored_spans += p.kept.num_rows
            self.duplicate_spans += p.duplicates
            self.segments += len(paths)
            self.commits += 1
            self.write_seconds.append(done - p.started)
            answer = [item for item in p.group if not item.resolved]
            for item in answer:
                item.resolved = True
                self._latency(done - item.queued_at)
        self._cover(p.gen)
        if self.on_stored is not None and p.kept.num_rows:  # before the direct answers: their 200 means handed on
            try:
                self.on_stored(p.kept)
            except Exception:  # forwarding is best effort: the spans are stored whatever happens here
                _log.warning("on_stored callback failed", exc_info=True)
        result = CommitResult(stored=p.kept.num_rows, duplicates=p.duplicates, segments=len(paths))
        for item in answer:
            item.future.set_result(result)

    def _lost(self, p: _Prepared, exc: Exception) -> None:
        """A group that will not be written: its keys are forgotten and its unanswered requests get 503;
        spans already answered from the journal stay there for the next start's replay."""
        with self._keys_lock:
            self.keys.discard(p.keys)
            self.failed_commits += 1
            self._write_failures += 1
        with self._cond:
            if any(item.early and item.resolved for item in p.group):
                self._journal_frozen = True
                _log.error("a group with acknowledged spans was not written (%s); they stay in the journal "
                           "and are stored at the next start", exc)
        self._fail(p.group, exc)
        self._cover(p.gen)

    def _cover(self, gen: int) -> None:
        """Every journal generation up to `gen` is in fsynced segments: its files may go."""
        with self._cond:
            if not self._journal_frozen and gen > self._covered:
                self._covered = gen
                self._cond.notify_all()

    def _journal_loop(self) -> None:
        """Append the bytes of journalled requests to their generation's file, fsync, answer them;
        delete the files whose generations are in segments."""
        import pyarrow.ipc as ipc

        from intake.collect.journal import ARROW, PROTOBUF, encode_record

        assert self.journal is not None
        while True:
            with self._cond:
                while not self._journal_queue and not self._journal_stop and self._covered <= self._dropped_gen:
                    self._cond.wait()
                batch = [item for item in self._journal_queue if not item.resolved]  # not yet in a segment
                self._journal_queue.clear()
                covered = self._covered
                started = dict(self._gen_starts)
                stop = self._journal_stop and not batch
            by_gen: dict[int, list[bytes]] = {}
            for item in batch:
                if item.body is not None:
                    record = encode_record(PROTOBUF, item.peer, item.body)
                else:
                    assert item.table is not None
                    sink = pa.BufferOutputStream()
                    with ipc.new_stream(sink, item.table.schema) as out:
                        out.write_table(item.table)
                    record = encode_record(ARROW, None, sink.getvalue().to_pybytes())
                item.body = None
                by_gen.setdefault(item.gen, []).append(record)
            error: Exception | None = None
            try:
                for gen, records in sorted(by_gen.items()):
                    self.journal.append(gen, started.get(gen, time.time_ns()), records)
            except Exception as exc:  # disk full and the like: these requests get 503 (their spans may
                error = exc            # still reach a segment; a re-send is then dropped as a duplicate)
            done = time.perf_counter()
            answer: list[_Pending] = []
            with self._cond:
                for item in batch:
                    if not item.resolved:
                        item.resolved = True
                        answer.append(item)
                        if error is None:
                            self._latency(done - item.queued_at)
                self.journalled_requests += len(answer) if error is None else 0
            for item in answer:
                if error is None:
                    item.future.set_result(CommitResult(stored=item.spans, duplicates=0, segments=0))
                else:
                    item.future.set_exception(error)
            try:
                self.journal.drop(covered)
            except OSError:
                _log.warning("could not delete journal files", exc_info=True)
            self._dropped_gen = covered
            if stop:
                self.journal.close()
                return

    def _resolve(self, group: list[_Pending], result: CommitResult) -> None:
        done = time.perf_counter()
        with self._cond:
            self.queued_spans -= sum(item.spans for item in group)
            answer = [item for item in group if not item.resolved]
            for item in answer:
                item.resolved = True
                self._latency(done - item.queued_at)
        for item in answer:
            item.future.set_result(result)

    def _fail(self, group: list[_Pending], exc: Exception) -> None:
        with self._cond:
            self.queued_spans -= sum(item.spans for item in group)
            answer = [item for item in group if not item.resolved]
            for item in answer:
                item.resolved = True
        for item in answer:
            item.future.set_exception(exc)
