"""Metrics from spans and the receiver's own health, for Prometheus (OpenMetrics, exemplars with trace ids).

`SpanMetrics.observe(table)` takes a table of promoted spans (tracing.schema columns) and adds
them to four latency histograms: `tailscope_request_duration_seconds` (the request span: end to
end), `tailscope_ttft_seconds` and `tailscope_tpot_seconds` (request spans stating a TTFT;
TPOT = (duration - TTFT) / (output tokens - 1), as the request model computes it) and
`tailscope_stage_duration_seconds` (each stage span's own duration: the critical-path share of a
stage needs the whole trace, which `tailscope report` computes). Counting is vectorized
(pyarrow group-by over label columns and bucket index); each bucket keeps the last trace that
fell in it as its exemplar.

Labels are bounded: each label keeps the first `LABEL_LIMITS[name]` distinct values it sees and
folds later ones into `other`; `tenant` is a label only when a bound is given (`tenants`), as
tenant ids can be unbounded. A span's adjusted count (sampling) is not applied: the histograms
count the spans received.

`ReceiverMetrics` reads a running receiver's counters at scrape time (nothing on the hot path
but the commit-latency histogram) and any extra gauges or counters the caller registers as
callbacks (`hook`), e.g. compaction lag, which are absent while their callback returns None.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.samples import Exemplar

from tracing import schema as S

#: Upper bounds (seconds) of the latency buckets: 1-2-5 steps below a second, then steps that keep
#: each bucket within 1.5x of its lower bound up to 2 minutes (the tail of LLM requests), then 5 and 10 minutes.
BUCKETS_S: Final[tuple[float, ...]] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0,
    64.0, 96.0, 128.0, 300.0, 600.0)
#: Distinct values a label keeps before folding the rest into OTHER (tenant: see `SpanMetrics(tenants=)`).
LABEL_LIMITS: Final[dict[str, int]] = {"service": 32, "model": 64, "model_version": 64, "replica": 512,
                                       "outcome": len(S.OUTCOMES) + 1, "stage": len(S.ALL_STAGES)}
#: The value a label takes beyond its bound (and for a missing value: "").
OTHER: Final = "other"

_REQUEST_LABELS: Final = ("service", "model", "model_version", "replica", "outcome")
_STAGE_LABELS: Final = ("service", "stage", "model", "model_version", "replica")
_COLUMN_OF: Final = {"service": "ServiceName", "model": "Model", "model_version": "ModelVersion",
                     "replica": "Replica", "outcome": "Outcome", "stage": "Stage", "tenant": "Tenant"}
_KEY_COLUMNS: Final = ("Stage", "Outcome", "ServiceName", "Model", "ModelVersion", "Replica")
_NEEDED: Final = ("IsRequest", "Stage", "Outcome", "ServiceName", "Model", "ModelVersion", "Replica", "Tenant",
                  "Duration", "TraceId", "TtftNs", "OutputTokens")
_BOUNDS_NS: Final = np.array([round(b * 1e9) for b in BUCKETS_S], dtype=np.int64)


class LabelBound:
    """The first `limit` distinct values of a label keep their name; later ones become OTHER."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.kept: set[str] = set()

    def name(self, value: str | None) -> str:
        """The label value for `value`: itself while within the bound, else OTHER ("" when missing)."""
        if not value:
            return ""
        if value in self.kept:
            return value
        if len(self.kept) < self.limit:
            self.kept.add(value)
            return value
        return OTHER


@dataclass
class _Series:
    """One histogram's counts for one label set: per-bucket counts (not cumulative), sum, last exemplar per bucket."""

    counts: np.ndarray = field(default_factory=lambda: np.zeros(len(BUCKETS_S) + 1, dtype=np.int64))
    sum_s: float = 0.0
    exemplars: dict[int, tuple[str, float, float]] = field(default_factory=dict)  # bucket -> (trace, value s, time)


def _escape(value: str) -> str:
    """A label value as the exposition formats write it (backslash, double quote and newline escaped)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


_LE: Final = [repr(b) for b in BUCKETS_S] + ["+Inf"]


class _Histogram:
    """A labelled latency histogram filled by whole columns at once."""

    def __init__(self, name: str, doc: str, labels: tuple[str, ...]) -> None:
        self.name, self.doc, self.labels = name, doc, labels
        self.series: dict[tuple[str, ...], _Series] = {}
        self._prefixes: dict[tuple[str, ...], tuple[list[str], str, str]] = {}  # the line starts of a label set

    def snapshot(self) -> list[tuple[tuple[str, ...], list[int], float, dict[int, tuple[str, float, float]]]]:
        """(labels, cumulative bucket counts, sum, exemplars) of every label set (taken under the caller's lock)."""
        return [(k, np.cumsum(s.counts).tolist(), s.sum_s, dict(s.exemplars)) for k, s in self.series.items()]

    def render(self, snapshot: list[tuple[tuple[str, ...], list[int], float, dict[int, tuple[str, float, float]]]],
               openmetrics: bool) -> str:
        """The exposition text of a snapshot: HELP, TYPE, then per label set its buckets (with their exemplars in
        OpenMetrics), count and sum. Written here rather than by prometheus_client's encoder, which takes
        about 20x as long per series (benchmarks/bench_metrics.py); test_metrics checks both parse the same."""
        out = [f"# HELP {self.name} {self.doc}\n# TYPE {self.name} histogram\n"]
        for key, cum, total, exemplars in snapshot:
            pre = self._prefixes.get(key)
            if pre is None:
                labels = ",".join(f'{n}="{_escape(v)}"' for n, v in zip(self.labels, key, strict=True))
                sep = "," if labels else ""
                pre = self._prefixes[key] = ([f'{self.name}_bucket{{{labels}{sep}le="{le}"}} ' for le in _LE],
                                             f"{self.name}_count{{{labels}}} ", f"{self.name}_sum{{{labels}}} ")
            buckets, count, sum_ = pre
            for i, line in enumerate(buckets):
                ex = exemplars.get(i) if openmetrics else None
                if ex is None:
                    out.append(f"{line}{cum[i]}\n")
                else:
                    out.append(f'{line}{cum[i]} # {{trace_id="{_escape(ex[0])}"}} {ex[1]!r} {ex[2]!r}\n')
            out.append(f"{count}{cum[-1]}\n{sum_}{total!r}\n")
        return "".join(out)

    def add(self, key: tuple[str, ...], bucket: int, count: int, total_s: float, exemplar: tuple[str, float, float]
            ) -> None:
        """Add `count` values of one bucket (their sum in s, the exemplar of the last) to a label set."""
        series = self.series.get(key)
        if series is None:
            series = self.series[key] = _Series()
        series.counts[bucket] += count
        series.sum_s += total_s
        series.exemplars[bucket] = exemplar

    def family(self, extra_labels: tuple[str, ...] = ()) -> HistogramMetricFamily:
        """The OpenMetrics family: cumulative buckets with their exemplars, count and sum per label set."""
        fam = HistogramMetricFamily(self.name, self.doc, labels=[*self.labels, *extra_labels])
        for key, s in self.series.items():
            cum = np.cumsum(s.counts)
            buckets: list[Any] = []
            for i, bound in enumerate([*BUCKETS_S, float("inf")]):
                ex = s.exemplars.get(i)
                le = "+Inf" if bound == float("inf") else repr(bound)
                exemplar = Exemplar({"trace_id": ex[0]}, ex[1], ex[2]) if ex is not None else None
                buckets.append((le, int(cum[i]), exemplar) if exemplar is not None else (le, int(cum[i])))
            fam.add_metric(list(key), buckets, s.sum_s)
        return fam


def _groups(t: pa.Table, cols: list[str], kind: np.ndarray, values_ns: np.ndarray) -> list[dict[str, Any]]:
    """One dict per (kind, label columns, bucket) of the rows: count, sum of the values (s), last row index
    (`i_max`), in order of first appearance (one pyarrow group-by; rows of kind -1 come back and are ignored)."""
    bucket = np.searchsorted(_BOUNDS_NS, values_ns, side="left").astype(np.int64)  # le: value <= bound
    data = pa.table([t.column(c) for c in cols] + [pa.array(kind), pa.array(bucket),
                                                    pa.array(values_ns.astype(np.float64) / 1e9),
                                                    pa.array(np.arange(values_ns.size, dtype=np.int64))],
                    names=[*cols, "kind", "b", "v", "i"])
    agg = data.group_by([*cols, "kind", "b"], use_threads=False).aggregate(
        [("v", "count"), ("v", "sum"), ("i", "max")]).to_pylist()
    return agg


def _bucket_figures(g: dict[str, Any], values_ns: np.ndarray, ids: pa.ChunkedArray | pa.Array, now: float
                    ) -> tuple[int, int, float, tuple[str, float, float]]:
    """(bucket, count, sum s, exemplar) of a group: the exemplar is its last row (trace id, value s, now)."""
    i = int(g["i_max"])
    return int(g["b"]), int(g["v_count"]), float(g["v_sum"]), (str(ids[i].as_py()), float(values_ns[i]) / 1e9, now)


class SpanMetrics:
    """Latency histograms from stored spans (the class docstring of the module says which); a Prometheus collector."""

    def __init__(self, tenants: int = 0) -> None:
        self.tenants = tenants
        extra = ("tenant",) if tenants > 0 else ()
        self.bounds = {name: LabelBound(limit) for name, limit in LABEL_LIMITS.items()}
        if tenants > 0:
            self.bounds["tenant"] = LabelBound(tenants)
        self.request = _Histogram("tailscope_request_duration_seconds",
                                  "End-to-end latency of inference requests (the request span).",
                                  _REQUEST_LABELS + extra)
        self.ttft = _Histogram("tailscope_ttft_seconds", "Time to first token of requests that state it.",
                               _REQUEST_LABELS + extra)
        self.tpot = _Histogram("tailscope_tpot_seconds", "Time per output token after the first: "
                               "(duration - TTFT) / (output tokens - 1).", _REQUEST_LABELS + extra)
        self.stage = _Histogram("tailscope_stage_duration_seconds",
                                "Duration of each stage span (not its critical-path share).", _STAGE_LABELS)
        self._lock = threading.Lock()
        self.spans = 0

    def observe(self, table: pa.Table) -> None:
        """Add a table of promoted spans (tracing.schema columns) to the histograms; never raises into the caller."""
        try:
            self._observe(table)
        except (KeyError, pa.ArrowException, ValueError, TypeError):  # a table without the promoted columns
            return

    def _observe(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        now = time.time()
        t = table.select(_NEEDED)  # the attribute maps and events are never copied
        is_request = pc.fill_null(t.column("IsRequest"), False).to_numpy(zero_copy_only=False)
        has_stage = pc.is_valid(t.column("Stage")).to_numpy(zero_copy_only=False)
        kind = np.where(is_request, 0, np.where(has_stage, 1, -1)).astype(np.int8)
        dur = pc.fill_null(t.column("Duration"), 0).to_numpy(zero_copy_only=False).astype(np.int64)
        ids = t.column("TraceId")
        cols = list(_KEY_COLUMNS) + (["Tenant"] if self.tenants > 0 else [])
        ttft_col = t.column("TtftNs")
        timed = np.flatnonzero(is_request & pc.is_valid(ttft_col).to_numpy(zero_copy_only=False))
        with self._lock:
            self.spans += t.num_rows
            for g in _groups(t, cols, kind, dur):
                if g["kind"] == 0:
                    self.request.add(self._request_key(g), *_bucket_figures(g, dur, ids, now))
                elif g["kind"] == 1:
                    self.stage.add(self._stage_key(g), *_bucket_figures(g, dur, ids, now))
            if timed.size:
                sub = t.take(pa.array(timed))
                ttft = ttft_col.to_numpy(zero_copy_only=False)[timed].astype(np.int64)
                sub_ids = sub.column("TraceId")
                for g in _groups(sub, cols, np.zeros(timed.size, np.int8), ttft):
                    self.ttft.add(self._request_key(g), *_bucket_figures(g, ttft, sub_ids, now))
                out = np.nan_to_num(sub.column("OutputTokens").to_numpy(zero_copy_only=False).astype(np.float64))
                many = np.flatnonzero(out > 1)
                if many.size:
                    tpot = np.round((dur[timed][many] - ttft[many]) / (out[many] - 1)).astype(np.int64)
                    sub2 = sub.take(pa.array(many))
                    for g in _groups(sub2, cols, np.zeros(many.size, np.int8), tpot):
                        self.tpot.add(self._request_key(g), *_bucket_figures(g, tpot, sub2.column("TraceId"), now))

    def _request_key(self, g: dict[str, Any]) -> tuple[str, ...]:
        b = self.bounds
        key = (b["service"].name(g["ServiceName"]), b["model"].name(g["Model"]),
               b["model_version"].name(g["ModelVersion"]), b["replica"].name(g["Replica"]),
               b["outcome"].name(g["Outcome"] or "ok"))
        return (*key, b["tenant"].name(g["Tenant"])) if self.tenants > 0 else key

    def _stage_key(self, g: dict[str, Any]) -> tuple[str, ...]:
        b = self.bounds
        return (b["service"].name(g["ServiceName"]), b["stage"].name(g["Stage"]), b["model"].name(g["Model"]),
                b["model_version"].name(g["ModelVersion"]), b["replica"].name(g["Replica"]))

    def series_count(self) -> int:
        """Label sets across the four histograms (each is len(BUCKETS_S) + 3 samples)."""
        with self._lock:
            return sum(len(h.series) for h in (self.request, self.ttft, self.tpot, self.stage))

    def collect(self) -> Iterator[Metric]:
        """The four histogram families (prometheus_client's collector protocol; /metrics uses `render`)."""
        with self._lock:
            families = [self.request.family(), self.ttft.family(), self.tpot.family(), self.stage.family()]
        yield from families

    def render(self, openmetrics: bool = True) -> bytes:
        """The four histograms as exposition text (OpenMetrics with exemplars, or the classic text format),
        without the final `# EOF`; counts are copied under the lock and formatted outside it."""
        hists = (self.request, self.ttft, self.tpot, self.stage)
        with self._lock:
            snaps = [h.snapshot() for h in hists]
        return "".join(h.render(snap, openmetrics) for h, snap in zip(hists, snaps, strict=True)).encode()


def store_bytes(store: Path) -> int:
    """Bytes of every file under the store (segments, derived requests, journal, alerts)."""
    total = 0
    stack = [str(store)]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                        elif entry.is_file(follow_symlinks=False):
                            total += entry.stat(follow_symlinks=False).st_size
                    except OSError:  # removed meanwhile (compaction, retention)
                        continue
        except OSError:
            continue
    return total


@dataclass(frozen=True)
class Hook:
    """A metric whose value a callback gives at scrape time (None: absent), e.g. compaction lag from its owner."""

    name: str
    doc: str
    kind: str  # "gauge" or "counter"
    read: Callable[[], float | None]


def compaction_hooks(compactor: Any) -> list[Hook]:
    """The compactor's figures on the receiver's /metrics (intake.compact.merge.Compactor, read at scrape time)."""
    c = compactor
    return [
        Hook("tailscope_compaction_pending_hours", "Settled hours still holding small segments after the last pass.",
             "gauge", lambda: float(c.last.pending_hours) if c.passes else None),
        Hook("tailscope_compaction_max_files_per_hour", "Most segments a reader reads in an hour, after the last pass.",
             "gauge", lambda: float(c.last.max_files_per_hour) if c.passes else None),
        Hook("tailscope_compaction_last_pass_age_seconds", "Seconds since the last compaction pass ended.",
             "gauge", lambda: None if c.last_pass_s is None else max(0.0, c.clock() - c.last_pass_s)),
        Hook("tailscope_compaction_merges", "Merges written.", "counter", lambda: float(c.total_merges)),
        Hook("tailscope_compaction_failed", "Merges that failed in the last pass (retried later).", "gauge",
             lambda: float(c.last.failed) if c.passes else None),
        Hook("tailscope_retention_removed_hours", "Hours removed by retention.", "counter",
             lambda: float(c.removed_hours)),
    ]


class ReceiverLike(Protocol):
    """What ReceiverMetrics reads of a receiver (intake.collect.receiver.Receiver)."""

    store: Path
    committer: Any

    def stats(self) -> Any:
        """The counters now."""


class ReceiverMetrics:
    """The receiver's health on /metrics: its counters at scrape time, the commit-latency histogram, store bytes."""

    #: Seconds a measured store size is reused (walking a big store on every scrape would cost).
    STORE_BYTES_TTL_S: Final = 10.0

    def __init__(self, receiver: ReceiverLike, hooks: Iterable[Hook] = ()) -> None:
        self.receiver = receiver
        self.hooks = list(hooks)
        self._bytes: tuple[float, int] | None = None

    def hook(self, name: str, doc: str, read: Callable[[], float | None], kind: str = "gauge") -> None:
        """Expose another figure (compaction lag, retention deletions...) read from `read` at each scrape."""
        self.hooks.append(Hook(name, doc, kind, read))

    def _store_bytes(self) -> int:
        now = time.monotonic()
        if self._bytes is None or now - self._bytes[0] > self.STORE_BYTES_TTL_S:
            self._bytes = (now, store_bytes(self.receiver.store))
        return self._bytes[1]

    def collect(self) -> Iterator[Metric]:
        """Counters and gauges of the receiver now (prometheus_client's collector protocol)."""
        r = self.receiver
        s = r.stats()

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            return CounterMetricFamily(f"tailscope_receiver_{name}", doc, value=value)

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"tailscope_receiver_{name}", doc, value=value)

        yield counter("requests", "OTLP export requests decoded.", s.requests)
        yield counter("spans_received", "Spans in decoded requests.", s.received_spans)
        yield counter("spans_stored", "Spans written to segments.", s.stored_spans)
        yield counter("spans_duplicate", "Spans dropped as already stored (same trace and span id).",
                      s.duplicate_spans)
        refused = CounterMetricFamily("tailscope_receiver_refused", "Requests or spans refused, by reason: "
                                      "bad_request (4xx), overload (503: queue or bytes full, shutting down), "
                                      "invalid_span (spans rejected inside an accepted request).", labels=["reason"])
        refused.add_metric(["bad_request"], s.bad_requests)
        refused.add_metric(["overload"], s.refused_requests)
        refused.add_metric(["invalid_span"], s.rejected_spans)
        yield refused
        yield counter("segments_written", "Segments written.", s.segments)
        yield counter("commits", "Commit groups written.", s.commits)
        yield gauge("queue_spans", "Spans accepted and not yet in a segment.", s.queued_spans)
        yield gauge("inflight_bytes", "Request bytes being read or decoded.", s.inflight_bytes)
        yield gauge("store_bytes", f"Bytes of the store on disk (measured at most every {self.STORE_BYTES_TTL_S:g} s).",
                    self._store_bytes())
        yield from r.committer.latency_histogram.collect()
        for h in self.hooks:
            try:
                value = h.read()
            except Exception:  # a failing hook is absent, never a failed scrape
                value = None
            if value is None:
                continue
            fam = (CounterMetricFamily if h.kind == "counter" else GaugeMetricFamily)(h.name, h.doc, value=value)
            yield fam

