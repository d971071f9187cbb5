"""Carry a request across a queue: W3C trace context in the queued message, queue_wait in the worker.

API process (the request span lives here):

    with tracing.request(model="m") as req:
        job = {"prompt": p, "headers": tracing.inject(request=req)}
        queue.put(job); reply = results.get()
        tracing.apply_report(req, reply["telemetry"])   # outcome, output tokens, TTFT from the worker

Worker process:

    job = queue.get()
    with tracing.resume(job["headers"]) as req:   # records queue_wait: enqueue -> now
        with req.stage("generation"): ...
        results.put({"telemetry": req.report(), ...})

Stage spans made in the worker are children of the API's request span (one trace, one
request row). Times are wall-clock ns, so queue_wait across hosts includes clock skew.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, MutableMapping
from typing import Final

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context

from tracing._context import REQUEST_KEY, W3C, extract, tracer
from tracing.instrument import QUEUE_WAIT, Request

__all__ = ["ENQUEUED_NS_KEY", "RemoteRequest", "apply_report", "enqueued_ns", "extract", "inject", "resume"]

#: Carrier key holding the wall-clock ns at which the message was enqueued.
ENQUEUED_NS_KEY: Final = "tailscope-enqueued-ns"
_now = time.time_ns


def inject(carrier: MutableMapping[str, str] | None = None, *, request: Request | None = None,
           context: Context | None = None, enqueued_ns: int | None = None) -> MutableMapping[str, str]:
    """Write `traceparent` / `tracestate` and the enqueue time into `carrier` (a new dict if None).

    The context is the given request's, else `context`, else the current one.
    """
    out: MutableMapping[str, str] = {} if carrier is None else carrier
    ctx = request.context if request is not None else context
    W3C.inject(out, context=ctx)
    out[ENQUEUED_NS_KEY] = str(enqueued_ns if enqueued_ns is not None else _now())
    return out


def enqueued_ns(carrier: Mapping[str, str]) -> int | None:
    """The enqueue time written by `inject`, or None."""
    raw = carrier.get(ENQUEUED_NS_KEY)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


class RemoteRequest(Request):
    """A request whose span lives in another process: stages made here become its children.

    Ending it ends no span; `report()` gives what the owning process should apply.
    """

    __slots__ = ("first_token_ns",)

    def __init__(self, ctx: Context) -> None:
        span = trace.get_current_span(ctx)
        super().__init__(span, Context(), 0, tracer())
        self.first_token_ns: int | None = None
        self._ctx = otel_context.set_value(REQUEST_KEY, self, ctx)

    def first_token(self, at_ns: int | None = None) -> None:
        """Record the wall-clock time of the first token (reported back, not stored here)."""
        if self.first_token_ns is None:
            self.first_token_ns = at_ns if at_ns is not None else _now()

    def end(self, end_ns: int | None = None) -> None:
        """Nothing to end here: the request span belongs to the process that opened it."""
        self._ended = True

    def report(self) -> dict[str, str]:
        """Outcome, error type, output tokens and first-token time, as strings for a message."""
        out: dict[str, str] = {}
        if self._outcome is not None:
            out["outcome"] = self._outcome
        if self._error_type is not None:
            out["error_type"] = self._error_type
        if self.output_tokens is not None:
            out["output_tokens"] = str(self.output_tokens)
        if self.first_token_ns is not None:
            out["first_token_ns"] = str(self.first_token_ns)
        return out


def apply_report(req: Request, report: Mapping[str, str]) -> None:
    """Apply a worker's `RemoteRequest.report()` to the request span owned here."""
    if "output_tokens" in report:
        req.output_tokens = int(report["output_tokens"])
    if "first_token_ns" in report:
        req.first_token(int(report["first_token_ns"]))
    outcome = report.get("outcome")
    if outcome is not None and outcome != "ok":
        req.set_outcome(outcome, report.get("error_type"))


def resume(carrier: Mapping[str, str], *, dequeued_ns: int | None = None, queue_wait: bool = True) -> RemoteRequest:
    """Continue, in a worker, the request whose context `carrier` carries; record its queue_wait.

    queue_wait runs from the enqueue time in the carrier to `dequeued_ns` (default: now).
    """
    ctx = extract(carrier)
    req = RemoteRequest(ctx)
    start = enqueued_ns(carrier)
    if queue_wait and start is not None:
        end = dequeued_ns if dequeued_ns is not None else _now()
        req.record_stage(QUEUE_WAIT, start, max(start, end))
    return req
