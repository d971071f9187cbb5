"""`tailscope collect --forward URL`: send what was stored on to an OpenTelemetry Collector over OTLP/HTTP.

After a group commit is durable, its spans (normalized: engine request spans carry their
`tailscope.*` facts as attributes and the synthetic stage spans travel with them, docs/engines.md)
are queued here and posted by one worker thread as OTLP/HTTP protobuf, gzip-compressed, to the
URL (a Collector's `/v1/traces`, or another `tailscope collect`). Forwarding never blocks or fails
intake: the queue is bounded in spans and a group that does not fit is dropped and counted; a
429/502/503/504 or a network error is retried with backoff (honouring Retry-After) for up to
`retry_s`, any other refusal drops the batch. Nothing here is on the request path.
"""

from __future__ import annotations

import gzip
import http.client
import logging
import random
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans

from tracing import schema as S

_log = logging.getLogger(__name__)

#: Statuses after which the same batch is sent again (the OTLP/HTTP spec's retryable ones).
RETRYABLE = frozenset({429, 502, 503, 504})
#: Spans per OTLP request (a Collector's default body limits are far above this).
BATCH_SPANS = 5_000
_KIND = {name: i for i, name in enumerate(S.SPAN_KINDS)}
_STATUS = {name: i for i, name in enumerate(S.STATUS_CODES)}
_COLUMNS = ("TraceId", "SpanId", "ParentSpanId", "TraceState", "SpanName", "SpanKind", "ResourceAttributes",
            "ScopeName", "ScopeVersion", "SpanAttributes", "TimestampNs", "Duration", "StatusCode",
            "StatusMessage", "Events", "Links")


def _set_attrs(target: Any, pairs: Iterable[tuple[str, str]] | None) -> None:
    """Stored attributes (values already strings) as OTLP string KeyValues."""
    target.extend(KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in pairs or ())


def to_request(table: pa.Table) -> ExportTraceServiceRequest:
    """One ExportTraceServiceRequest of every span in `table` (SPAN_SCHEMA), grouped by resource and scope.

    Attribute values are sent as the strings they are stored as; ids, times (ns), kind, status,
    events and links as they came, so a receiver that promotes by the convention's rules stores the
    same columns (tests/intake/test_collect_forward.py).
    """
    request = ExportTraceServiceRequest()
    resources: dict[tuple[tuple[str, str], ...], ResourceSpans] = {}
    scopes: dict[tuple[int, str, str], ScopeSpans] = {}
    for row in table.select(list(_COLUMNS)).to_pylist():
        res_key = tuple(row["ResourceAttributes"] or ())
        rs = resources.get(res_key)
        if rs is None:
            rs = resources[res_key] = request.resource_spans.add()
            _set_attrs(rs.resource.attributes, res_key)
        scope_key = (id(rs), row["ScopeName"], row["ScopeVersion"])
        ss = scopes.get(scope_key)
        if ss is None:
            ss = scopes[scope_key] = rs.scope_spans.add()
            ss.scope.name, ss.scope.version = row["ScopeName"], row["ScopeVersion"]
        sp = ss.spans.add()
        sp.trace_id = bytes.fromhex(row["TraceId"])
        sp.span_id = bytes.fromhex(row["SpanId"])
        if row["ParentSpanId"]:
            sp.parent_span_id = bytes.fromhex(row["ParentSpanId"])
        sp.trace_state = row["TraceState"]
        sp.name = row["SpanName"]
        sp.kind = _KIND.get(row["SpanKind"], 0)  # type: ignore[assignment]
        sp.start_time_unix_nano = row["TimestampNs"]
        sp.end_time_unix_nano = row["TimestampNs"] + row["Duration"]
        _set_attrs(sp.attributes, row["SpanAttributes"])
        sp.status.code = _STATUS.get(row["StatusCode"], 0)  # type: ignore[assignment]
        sp.status.message = row["StatusMessage"]
        for ev in row["Events"] or ():
            e = sp.events.add()
            e.time_unix_nano, e.name = ev["TimestampNs"], ev["Name"]
            _set_attrs(e.attributes, ev["Attributes"])
        for ln in row["Links"] or ():
            link = sp.links.add()
            link.trace_id, link.span_id = bytes.fromhex(ln["TraceId"]), bytes.fromhex(ln["SpanId"])
            link.trace_state = ln["TraceState"]
            _set_attrs(link.attributes, ln["Attributes"])
    return request


class Forwarder:
    """A bounded queue of stored span tables and the thread that posts them to `url`."""

    def __init__(self, url: str, *, token: str | None = None, max_queue_spans: int = 200_000,
                 timeout_s: float = 10.0, retry_s: float = 300.0, batch_spans: int = BATCH_SPANS) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--forward: {url!r} is not an http(s) URL (e.g. http://127.0.0.1:4318/v1/traces)")
        self.url = url
        self._parts = parts
        self._headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self.max_queue_spans = max_queue_spans
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.batch_spans = batch_spans
        self._queue: deque[pa.Table] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._abandoned = False  # set by close(): the counters are settled, the worker must not touch them
        self._conn: http.client.HTTPConnection | None = None
        self._thread = threading.Thread(target=self._run, name="tailscope-forward", daemon=True)
        # counters (read by the progress line)
        self.queued_spans = 0
        self.forwarded_spans = 0
        self.dropped_spans = 0
        self.retries = 0
        self.last_error = ""

    def start(self) -> None:
        """Start the worker thread."""
        self._thread.start()

    def submit(self, table: pa.Table) -> None:
        """Queue `table` to forward; drop it (counted) when it does not fit. Never raises, never waits."""
        n = table.num_rows
        if n == 0:
            return
        with self._cond:
            if self._closing or self.queued_spans + n > self.max_queue_spans:
                self.dropped_spans += n
                return
            self._queue.append(table)
            self.queued_spans += n
            self._cond.notify()

    def close(self, timeout_s: float) -> None:
        """Send what is queued for up to `timeout_s`, then stop; what is left is counted as dropped."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self.queued_spans and self._thread.is_alive() and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(min(left, 0.1))
            self._closing = True
            self._cond.notify_all()
        self._thread.join(max(0.0, deadline - time.monotonic()) + 0.5)
        conn = self._conn
        if conn is not None:
            conn.close()
        with self._cond:
            self._abandoned = True
            self.dropped_spans += self.queued_spans
            self.queued_spans = 0
            self._queue.clear()

    # --- the worker ----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if self._closing:
                    return
                table = self._queue[0]
            for lo in range(0, table.num_rows, self.batch_spans):
                part = table.slice(lo, self.batch_spans)
                try:
                    ok = self._send(gzip.compress(to_request(part).SerializeToString(), compresslevel=1))
                except Exception as exc:  # a bug here must not end forwarding: drop the batch, say why once
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    _log.warning("forward: could not send a batch (%s); dropped", self.last_error)
                    ok = False
                with self._cond:
                    if self._abandoned:
                        return
                    if ok:
                        self.forwarded_spans += part.num_rows
                    else:
                        self.dropped_spans += part.num_rows
                    self.queued_spans -= part.num_rows
                    self._cond.notify_all()
                    if self._closing:
                        return
            with self._cond:
                if self._queue:
                    self._queue.popleft()

    def _send(self, body: bytes) -> bool:
        """POST one batch; retry retryable failures with backoff until `retry_s` has passed. True when accepted."""
        give_up = time.monotonic() + self.retry_s
        delay = 0.5
        while True:
            wait: float | None = None
            try:
                status, retry_after = self._post(body)
            except (OSError, http.client.HTTPException) as exc:
                self._drop_connection()
                self.last_error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            else:
                if 200 <= status < 300:
                    return True
                self.last_error = f"HTTP {status}"
                if status not in RETRYABLE:
                    _log.warning("forward: %s answered %s; batch dropped", self.url, status)
                    return False
                wait = retry_after
            self.retries += 1
            sleep = wait if wait is not None else delay * random.uniform(0.5, 1.0)
            delay = min(delay * 2, 30.0)
            if time.monotonic() + sleep > give_up:
                return False
            with self._cond:
                if self._cond.wait_for(lambda: self._closing, timeout=sleep):
                    return False

    def _post(self, body: bytes) -> tuple[int, float | None]:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self._parts.scheme == "https" else http.client.HTTPConnection
            self._conn = cls(self._parts.hostname or "", self._parts.port, timeout=self.timeout_s)
        path = self._parts.path or "/v1/traces"
        if self._parts.query:
            path += "?" + self._parts.query
        self._conn.request("POST", path, body=body, headers=self._headers)
        response = self._conn.getresponse()
        response.read()
        if response.will_close:
            self._drop_connection()
        return response.status, _retry_after(response.getheader("Retry-After"))

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (the delta form; a date or garbage gives None), capped at 60 s."""
    if value is None:
        return None
    try:
        return min(max(float(value), 0.0), 60.0)
    except ValueError:
        return None


def describe(forwarder: Forwarder | None) -> Sequence[str]:
    """The progress line's forwarding fields (none when not forwarding)."""
    if forwarder is None:
        return ()
    f = forwarder
    return (f"forwarded {f.forwarded_spans:,}", f"fwd queue {f.queued_spans:,}", f"fwd dropped {f.dropped_spans:,}")


__all__ = ["BATCH_SPANS", "RETRYABLE", "Forwarder", "describe", "to_request"]
