"""The part of the receiver both front ends share: auth, byte budget, decode, queueing, counters."""

from __future__ import annotations

import hmac
import threading
from concurrent.futures import Future

from intake.collect.commit import CommitResult, Committer
from intake.collect.config import CollectConfig
from intake.collect.decode import PROTOBUF, Decoded, decode_body
from intake.otlp import DecodeResult
from intake.peer import with_peer
from tracing.errors import RetryLater


class Busy(RetryLater):
    """Too many request bytes are being read or decoded at once; the client should retry."""


class Intake:
    """Turns request bodies into queued commits and counts what happened."""

    def __init__(self, config: CollectConfig, committer: Committer) -> None:
        self.config = config
        self.committer = committer
        self._expected = config.token.encode() if config.token else None
        self._lock = threading.Lock()
        self.inflight_bytes = 0
        self.draining = False
        self.requests = 0
        self.received_spans = 0
        self.rejected_spans = 0
        self.bad_requests = 0
        self.refused_requests = 0

    def authorized(self, header: str | None) -> bool:
        """True when no token is configured or `header` is 'Bearer <token>' (the scheme in any case,
        as HTTP auth schemes are case-insensitive; the token compared in constant time)."""
        if self._expected is None:
            return True
        if header is None:
            return False
        scheme, _, token = header.strip().partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self._expected)

    def reserve(self, nbytes: int) -> None:
        """Claim `nbytes` of the in-flight byte budget; Busy when it would overflow (the caller
        answers 503 and counts it with `refused`)."""
        with self._lock:
            if self.inflight_bytes and self.inflight_bytes + nbytes > self.config.max_inflight_bytes:
                raise Busy(f"too many request bytes in flight ({self.inflight_bytes:,}); retry later")
            self.inflight_bytes += nbytes

    def release(self, nbytes: int) -> None:
        """Give back a claim made with `reserve`."""
        with self._lock:
            self.inflight_bytes -= nbytes

    def bad(self) -> None:
        """Count one request answered 4xx."""
        with self._lock:
            self.bad_requests += 1

    def refused(self) -> None:
        """Count one request refused for overload or shutdown (503)."""
        with self._lock:
            self.refused_requests += 1

    def accept(self, body: bytes, encoding: str, *, peer: str | None = None,
               journal: bool = False) -> tuple[Decoded, Future[CommitResult] | None]:
        """Decode `body` and queue its spans; raises ValueError (400), QueueFull or Closed (503).

        With `record_peer` and a known `peer`, every resource gets `tailscope.peer` (the C builder adds
        it as it copies the resource, so recording the peer keeps the fast path). `journal`: other clients
        are sending, so the answer may come once the body is in the journal (Committer).
        """
        peer = peer if self.config.record_peer else None
        if encoding == PROTOBUF:
            queued = self.committer.submit_protobuf(body, peer, journal=journal)  # the columnar fast path
            if queued is not None:
                n, fast = queued
                with self._lock:
                    self.requests += 1
                    self.received_spans += n
                return Decoded(None, DecodeResult(accepted=n)), fast
        decoded = decode_body(body, encoding)
        if peer is not None and decoded.table is not None:
            decoded.table = with_peer(decoded.table, peer)
        future = self.committer.submit(decoded.table, journal=journal) if decoded.table is not None else None
        with self._lock:
            self.requests += 1
            self.received_spans += decoded.result.accepted
            self.rejected_spans += decoded.result.rejected
        return decoded, future
