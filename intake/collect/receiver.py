"""The receiver: HTTP and gRPC front ends, one group-commit writer, a progress line, clean stop."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TextIO

import grpc
import pyarrow as pa

from intake.collect.commit import Committer, RecentKeys
from intake.collect.config import CollectConfig
from intake.collect.forward import Forwarder, describe
from intake.collect.grpc_server import make_server
from intake.collect.http import HttpServer
from intake.collect.intake import Intake
from intake.collect.journal import Journal
from intake.collect.metrics import SpanMetrics
from intake.collect.recovery import Replayed, remove_dead_temp_files, replay_journals
from intake.compact.merge import Compactor, make_compactor, start_background
from intake.engines import normalize
from intake.otlp import base_from_columns, new_builder, promote
from intake.recognition import Recognition, recognise
from tracing.store import SegmentWriter, init_store


@dataclass(frozen=True)
class Stats:
    """A snapshot of the receiver's counters."""

    requests: int
    received_spans: int
    stored_spans: int
    duplicate_spans: int
    rejected_spans: int
    bad_requests: int
    refused_requests: int
    segments: int
    commits: int
    queued_spans: int
    inflight_bytes: int
    recognised_requests: int = 0  # request spans among the spans prepared for storage


def use_system_memory_pool() -> bool:
    """Make the C heap (malloc) pyarrow's default pool for this process, unless ARROW_DEFAULT_MEMORY_POOL
    chose one; True when it did.

    pyarrow's default, mimalloc, kept what the startup's Parquet reads freed (the dedupe keys and the journal
    replay read ~20 segments): a restarted receiver sat 50-60 MiB above its first start (+43 MiB anonymous
    memory over 21 key reads, against +2 with malloc and +4 with jemalloc), and that is what the chaos
    test's RSS bound caught with the journal on (docs/benchmarks.md). Receiving costs the same
    CPU per span with either pool.
    """
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        return False
    pa.set_memory_pool(pa.system_memory_pool())
    return True


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


class Receiver:
    """`tailscope collect` as an object: `start()`, then `stop()` (or `serve_forever()`)."""

    def __init__(self, config: CollectConfig, *, on_hour_removed: Callable[[int], None] | None = None,
                 hour_extra_bytes: Callable[[int], int] | None = None,
                 say: Callable[[str], None] | None = None) -> None:
        """`on_hour_removed(hour_ns)` runs after retention removed an hour's spans and `hour_extra_bytes(hour_ns)`
        counts an hour's other files toward --max-store-gb (the CLI passes analysis's, for the materialized
        requests); `say` gets the compactor's one-line messages (default: stderr)."""
        self.config = config
        use_system_memory_pool()  # before the first Arrow allocation of the receiver (process-wide)
        self.store = init_store(config.store)
        self.writer = SegmentWriter(self.store, kind="collect", durable=config.durable)
        self.keys = RecentKeys(config.dedupe_window)
        self.recognition = Recognition()
        self.loaded_keys = 0
        self.removed_temp_files: list[Path] = []
        self.replayed = Replayed(0, 0, 0)
        metrics_on = config.metrics_port is not None and config.metrics_port >= 0
        self.span_metrics = SpanMetrics(config.metrics_tenants) if metrics_on else None
        self.forwarder = (Forwarder(config.forward, token=config.forward_token,
                                    max_queue_spans=config.forward_queue_spans, timeout_s=config.forward_timeout_s,
                                    retry_s=config.forward_retry_s) if config.forward else None)
        self.committer = Committer(self.writer, self.keys, max_queue_spans=config.max_queue_spans,
                                   prepare=self._prepare,
                                   builder=new_builder(), assemble=base_from_columns,
                                   gather_spans=config.gather_spans, gather_s=config.gather_ms / 1e3,
                                   senders=lambda: self._http.connections if self._http is not None else 0,
                                   on_stored=self.forwarder.submit if self.forwarder is not None else None,
                                   journal=(Journal(self.store, self.writer.writer, durable=config.durable)
                                            if config.journal_ms > 0 else None),
                                   journal_s=config.journal_ms / 1e3, segment_spans=config.segment_spans)
        self.intake = Intake(config, self.committer)
        keep = config.retention()
        self.compactor: Compactor | None = None
        if config.compact or keep.active:
            self.compactor = make_compactor(self.store, config.compact_policy(), keep,
                                            say=say or (lambda line: print(line, file=sys.stderr, flush=True)),
                                            on_removed=on_hour_removed, extra_bytes=hour_extra_bytes,
                                            merge=config.compact)
        self._compact_thread: threading.Thread | None = None
        self._compact_stop: threading.Event | None = None
        self.http_port: int | None = None
        self.grpc_port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._http: HttpServer | None = None
        self._grpc: grpc.Server | None = None
        self._grpc_threads: Callable[[], None] | None = None  # lets the gRPC handlers' pools go after stop
        self._stopped = threading.Event()
        self._stop_lock = threading.Lock()
        self._started_at = time.monotonic()

    def _prepare(self, table: pa.Table) -> pa.Table:
        """Promote and normalize one commit group (the committer's thread), counting its requests
        (and adding its spans to the latency histograms when /metrics is on)."""
        table = normalize(promote(table))
        self.recognition.add(recognise(table))
        if self.span_metrics is not None:
            self.span_metrics.observe(table)
        return table

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Load recent keys for dedupe, start the writer, bind and start both front ends."""
        self.removed_temp_files = remove_dead_temp_files(self.store)
        self.loaded_keys = self.keys.load(self.store, self.config.dedupe_startup_s)
        # spans a killed receiver answered 200 from its journal but had not yet written: stored before listening
        self.replayed = replay_journals(self.store, self.writer, self.keys, self._prepare)
        if self.forwarder is not None:
            self.forwarder.start()
        self.committer.start()
        if self.compactor is not None:  # its own thread: merges never hold an answer (docs/collect.md)
            self._compact_thread, self._compact_stop = start_background(self.compactor, self.config.compact_every_s)
        if self.config.grpc_port is not None:
            self._grpc, self.grpc_port, self._grpc_threads = make_server(self.intake, self.config.host,
                                                                         self.config.grpc_port)
            self._grpc.start()
        if self.config.http_port is not None:
            ready = threading.Event()
            errors: list[BaseException] = []
            self._loop = asyncio.new_event_loop()
            self._http = HttpServer(self.intake, self.config.host, self.config.http_port)

            def run() -> None:
                assert self._loop is not None and self._http is not None
                asyncio.set_event_loop(self._loop)
                try:
                    self.http_port = self._loop.run_until_complete(self._http.start())
                except BaseException as exc:
                    errors.append(exc)
                    ready.set()
                    return
                ready.set()
                self._loop.run_forever()

            self._loop_thread = threading.Thread(target=run, name="tailscope-http", daemon=True)
            self._loop_thread.start()
            ready.wait()
            if errors:
                self.stop()
                raise errors[0]
        self._started_at = time.monotonic()

    def stop(self) -> None:
        """Stop accepting, answer in-flight requests, write everything queued, then stop."""
        with self._stop_lock:
            if self._stopped.is_set():
                return
            self.intake.draining = True
            timeout = self.config.drain_timeout_s
            grpc_done = self._grpc.stop(grace=timeout) if self._grpc is not None else None
            if self._loop is not None and self._http is not None and self._loop.is_running():
                done = asyncio.run_coroutine_threadsafe(self._http.drain(timeout), self._loop)
                with contextlib.suppress(Exception):  # a drain that timed out still lets the flush run
                    done.result(timeout + 10)
            if grpc_done is not None:
                grpc_done.wait(timeout + 5)
            if self._grpc_threads is not None:
                self._grpc_threads()
            self.committer.close()
            if self._compact_stop is not None and self._compact_thread is not None:
                self._compact_stop.set()  # a merge cut short is undone at the next start
                self._compact_thread.join(timeout)
            if self.forwarder is not None:  # what is stored is sent on for a while, then counted as dropped
                self.forwarder.close(timeout)
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._loop.stop)
                if self._loop_thread is not None:
                    self._loop_thread.join(10)
                if not self._loop.is_running():
                    self._loop.close()
            self._stopped.set()

    def serve_forever(self, *, progress: TextIO | None = sys.stderr, interval_s: float = 1.0,
                      on_ready: Callable[[Receiver], None] | None = None) -> Stats:
        """Run until SIGTERM or SIGINT, printing the progress line; then stop cleanly."""
        stop_asked = threading.Event()

        def ask_stop(signum: int, frame: FrameType | None) -> None:
            stop_asked.set()

        previous = {sig: signal.signal(sig, ask_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            # the process is the receiver's: long-lived objects (modules, the dedupe window) leave the
            # cyclic GC's view and young collections run less often (requests make many short-lived,
            # acyclic objects)
            gc.collect()
            gc.freeze()
            gc.set_threshold(50_000, 20, 20)
            if on_ready is not None:
                on_ready(self)
            reporter = ProgressLine(self, progress) if progress is not None else None
            while not stop_asked.wait(interval_s):
                if reporter is not None:
                    reporter.tick()
            if reporter is not None:
                reporter.tick(final=False)
                progress.write("stopping: answering in-flight requests and writing the queue\n")  # type: ignore[union-attr]
                progress.flush()  # type: ignore[union-attr]
            self.stop()
            if reporter is not None:
                reporter.tick(final=True)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return self.stats()

    # --- figures -------------------------------------------------------------------------

    def stats(self) -> Stats:
        """The counters now."""
        c, i = self.committer, self.intake
        return Stats(requests=i.requests, received_spans=i.received_spans, stored_spans=c.stored_spans,
                     duplicate_spans=c.duplicate_spans, rejected_spans=i.rejected_spans,
                     bad_requests=i.bad_requests, refused_requests=i.refused_requests, segments=c.segments,
                     commits=c.commits, queued_spans=c.queued_spans, inflight_bytes=i.inflight_bytes,
                     recognised_requests=self.recognition.requests)

    def commit_latency_ms(self, q: float = 0.99) -> float:
        """The `q` quantile of submit-to-durable time over recent requests, in ms."""
        return _percentile(list(self.committer.latencies), q) * 1000


def compaction_line(compactor: Compactor | None) -> list[str]:
    """The store's part of the progress line: hours, segments, the most in one hour, settled hours not yet merged."""
    if compactor is None or not compactor.passes:
        return []
    r = compactor.last
    pending = f", {r.pending_hours} settled hour(s) to merge" if r.pending_hours else ""
    removed = f", {compactor.removed_hours} hour(s) removed" if compactor.removed_hours else ""
    return [f"store {r.hours} h, {r.files:,} segments (at most {r.max_files_per_hour} in an hour){pending}"
            f"{removed}, retention {compactor.retention_text}"]


class ProgressLine:
    """The console line: spans/s, totals, segments, rejected, duplicates, queue depth, p99 commit."""

    def __init__(self, receiver: Receiver, out: TextIO) -> None:
        self.receiver = receiver
        self.out = out
        self.tty = out.isatty()
        self._last = receiver.stats()
        self._last_t = time.monotonic()
        self._last_print = 0.0
        self._hinted = False

    def tick(self, *, final: bool = False) -> None:
        """Print one line (in place on a terminal, every 10 s or on change otherwise)."""
        now = time.monotonic()
        s = self.receiver.stats()
        rate = (s.stored_spans - self._last.stored_spans) / max(1e-9, now - self._last_t)
        changed = s != self._last
        self._last, self._last_t = s, now
        if not self.tty and not final and not (changed and now - self._last_print >= 10.0):
            return
        self._last_print = now
        line = (f"collect: {rate:,.0f} spans/s | stored {s.stored_spans:,} | "
                f"requests {s.recognised_requests:,} | segments {s.segments:,} | "
                f"rejected {s.rejected_spans:,} | duplicates {s.duplicate_spans:,} | "
                f"queue {s.queued_spans:,} spans | bad {s.bad_requests:,} | refused {s.refused_requests:,} | "
                f"p99 commit {self.receiver.commit_latency_ms():.1f} ms")
        line = " | ".join([line, *describe(self.receiver.forwarder), *compaction_line(self.receiver.compactor)])
        problem = self.receiver.recognition.problem(str(self.receiver.store))
        if problem is not None and not self._hinted:  # once: spans arrive but none is a request
            self._hinted = True
            self.out.write(("\r\x1b[2K" if self.tty else "") + problem + "\n")
        if self.tty:
            self.out.write("\r\x1b[2K" + line + ("\n" if final else ""))
        else:
            self.out.write(line + "\n")
        self.out.flush()
