"""OTLP/gRPC front end: `opentelemetry.proto.collector.trace.v1.TraceService/Export` on grpcio.

The method is registered with no deserializer, so the handler gets the raw request bytes
and decodes them exactly as the HTTP front end does. Status codes: INVALID_ARGUMENT for
malformed requests, UNAUTHENTICATED without the bearer token, RESOURCE_EXHAUSTED over
the size cap (grpcio enforces it after decompression), UNAVAILABLE (retryable) when the
queue is full, too many calls are in flight, or the receiver is stopping.

Every call is sorted by `_Gate` from its method and metadata before any message is read
(grpcio's server reads a unary request message as soon as a unary handler is chosen, and
checks the message-size cap only once the whole message is in, grpc/grpc#43012):

- without the token: a request-streaming handler that aborts without reading, run on its own
  one-thread pool, so unauthenticated calls never wait in or hold the authenticated calls'
  workers or slots. What such a caller can make the server hold is one HTTP/2 stream window,
  kept at 64 KiB by turning off BDP probing (below). At most `REFUSALS` of them wait for that
  thread at once; beyond that a call is answered UNIMPLEMENTED by grpcio itself, with no thread.
- with the token: one of `grpc_workers x 4` slots, taken in the gate and given back when the
  call's worker task ends, whatever became of the call; with no slot free the call is refused
  (UNAVAILABLE) without reading. A worker reads the message whole (grpcio has no streaming read
  of a unary message), so `read_workers` of them, at most `--max-inflight-mib / --max-body-mib`,
  bound the bytes being read at once; the message's size is then claimed on the byte budget
  before it is decoded.

Connections: idle ones are closed after `--idle-timeout-s`; each is gracefully recycled after
`--body-timeout-s` with as long again for its calls to finish, so a message that never arrives
holds a worker at most twice `--body-timeout-s`; the HTTP/2 handshake must end within
`--header-timeout-s`; metadata is capped at `--max-header-kib`; `--max-connections` at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import grpc

from intake.collect.commit import Closed, QueueFull
from intake.collect.config import CollectConfig
from intake.collect.decode import PROTOBUF, success_body
from intake.collect.intake import Busy, Intake
from intake.peer import peer_host

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
#: unauthenticated calls waiting for the refusal thread at once; more are answered by grpcio itself
REFUSALS = 64
UNAUTHENTICATED = "missing or wrong bearer token: send metadata 'authorization: Bearer <token>'"


def _abort(context: Any, intake: Intake, code: grpc.StatusCode, message: str) -> None:
    if code is grpc.StatusCode.UNAVAILABLE:
        intake.refused()
    else:
        intake.bad()
    context.abort(code, message)


class _Slots:
    """A count of admitted calls with a ceiling: taken before a call's message is read, given
    back when its worker task ends."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    def take(self) -> bool:
        """Claim one slot; False when all are in use."""
        with self._lock:
            if self.used >= self.limit:
                return False
            self.used += 1
            return True

    def give(self) -> None:
        """Return one slot taken with `take`."""
        with self._lock:
            self.used -= 1


class _SlotPool(ThreadPoolExecutor):
    """The worker pool of one kind of call: every task gives its call's slot back when it ends.

    grpcio submits exactly one task per call admitted by a handler whose behaviour names this
    pool (`experimental_thread_pool`), and the task runs whether or not the message arrives, so
    the count cannot leak when a client goes away mid-message."""

    def __init__(self, slots: _Slots, workers: int, name: str) -> None:
        super().__init__(max_workers=workers, thread_name_prefix=name)
        self.slots = slots

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:  # type: ignore[override]
        def run() -> Any:
            try:
                return fn(*args, **kwargs)
            finally:
                self.slots.give()

        try:
            return super().submit(run)
        except BaseException:
            self.slots.give()
            raise


class _Gate(grpc.GenericRpcHandler):
    """Chooses the handler of a call from its method and metadata, before any message is read
    (grpcio calls it from its polling thread, one call at a time)."""

    def __init__(self, intake: Intake, calls: _Slots, refusals: _Slots, export: grpc.RpcMethodHandler,
                 unauthenticated: grpc.RpcMethodHandler, busy: grpc.RpcMethodHandler) -> None:
        self.intake = intake
        self.calls = calls
        self.refusals = refusals
        self.export = export
        self.unauthenticated = unauthenticated
        self.busy = busy

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if handler_call_details.method != f"/{SERVICE}/Export":  # type: ignore[attr-defined]
            return None  # UNIMPLEMENTED
        metadata = dict(handler_call_details.invocation_metadata or ())  # type: ignore[attr-defined]
        authorized = self.intake.authorized(metadata.get("authorization"))
        if authorized and self.calls.take():
            return self.export
        if not self.refusals.take():  # a flood: grpcio answers UNIMPLEMENTED itself, no thread, nothing read
            self.intake.bad()
            return None
        return self.busy if authorized else self.unauthenticated


def read_workers(config: CollectConfig) -> int:
    """Workers reading authenticated messages at once: `grpc_workers`, fewer when messages of the
    largest size would overflow the in-flight byte budget."""
    return max(1, min(config.grpc_workers, config.max_inflight_bytes // config.max_body_bytes))


def server_options(config: CollectConfig) -> list[tuple[str, int]]:
    """grpcio channel arguments: the HTTP front end's size caps and timeouts, in grpc core's terms."""
    return [
        ("grpc.max_receive_message_length", config.max_body_bytes),
        ("grpc.max_send_message_length", 4 << 20),
        ("grpc.so_reuseport", 0),
        # no BDP probing: a stream's window stays at HTTP/2's initial 64 KiB until the handler asks
        # for the message (a pending read opens it to the message's size), so a refused call holds
        # kilobytes, not the megabytes a probed window lets a client send unasked (measured in
        # benchmarks/bench_grpc_unauth.py: 8 clients x 3 x 60 MiB refused, +26 MiB peak with
        # probing, +2 MiB without; 2.7 MiB authenticated bodies were no slower on loopback)
        ("grpc.http2.bdp_probe", 0),
        ("grpc.max_metadata_size", config.max_header_bytes),
        ("grpc.server_handshake_timeout_ms", int(config.header_timeout_s * 1000)),
        ("grpc.max_connection_idle_ms", int(config.idle_timeout_s * 1000)),
        ("grpc.max_connection_age_ms", int(config.body_timeout_s * 1000)),
        ("grpc.max_connection_age_grace_ms", int(config.body_timeout_s * 1000)),
        ("grpc.max_allowed_incoming_connections", config.max_connections),
    ]


def make_server(intake: Intake, host: str, port: int) -> tuple[grpc.Server, int, Callable[[], None]]:
    """A started-able grpc.Server serving TraceService/Export, its bound port, and a function that
    lets the handlers' worker threads go once the server has stopped."""
    config = intake.config

    def export(request: bytes, context: Any) -> bytes:
        try:
            intake.reserve(len(request))
        except Busy as exc:
            _abort(context, intake, grpc.StatusCode.UNAVAILABLE, str(exc))
        try:
            decoded, future = intake.accept(request, PROTOBUF, peer=peer_host(context.peer()))
        except (QueueFull, Closed) as exc:
            _abort(context, intake, grpc.StatusCode.UNAVAILABLE, f"{exc}; retry")
            raise AssertionError("unreachable") from None
        except ValueError as exc:
            _abort(context, intake, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise AssertionError("unreachable") from None
        finally:
            intake.release(len(request))
        if future is not None:
            try:
                future.result()
            except Exception as exc:
                _abort(context, intake, grpc.StatusCode.UNAVAILABLE, f"could not store the spans ({exc}); retry")
        return success_body(decoded.result, PROTOBUF)

    def unauthenticated(requests: Any, context: Any) -> bytes:
        """An unauthenticated call: answered without asking for its message."""
        _abort(context, intake, grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED)
        raise AssertionError("unreachable")

    def busy(requests: Any, context: Any) -> bytes:
        """An authenticated call with every slot in use: answered (retryable) without reading it."""
        _abort(context, intake, grpc.StatusCode.UNAVAILABLE,
               f"too many gRPC calls in flight ({calls.limit}); retry")
        raise AssertionError("unreachable")

    calls = _Slots(config.grpc_workers * 4)
    refusals = _Slots(REFUSALS)
    export.experimental_thread_pool = _SlotPool(calls, read_workers(config), "tailscope-grpc")  # type: ignore[attr-defined]
    refusal_pool = _SlotPool(refusals, 1, "tailscope-grpc-refuse")
    unauthenticated.experimental_thread_pool = refusal_pool  # type: ignore[attr-defined]
    busy.experimental_thread_pool = refusal_pool  # type: ignore[attr-defined]
    handler = _Gate(intake, calls, refusals,
                    grpc.unary_unary_rpc_method_handler(export, request_deserializer=None, response_serializer=None),
                    grpc.stream_unary_rpc_method_handler(unauthenticated, request_deserializer=None,
                                                         response_serializer=None),
                    grpc.stream_unary_rpc_method_handler(busy, request_deserializer=None, response_serializer=None))
    # grpcio's own pool runs nothing of ours (each handler names its pool); no maximum_concurrent_rpcs,
    # since grpcio would count refused calls against it and let a flood of them starve good ones
    server = grpc.server(ThreadPoolExecutor(max_workers=1, thread_name_prefix="tailscope-grpc-default"),
                         handlers=(handler,), options=server_options(config))
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    bound = server.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"could not bind gRPC to {host}:{port}")

    def release_threads() -> None:
        for pool in (export.experimental_thread_pool, refusal_pool):  # type: ignore[attr-defined]
            pool.shutdown(wait=False)

    return server, bound, release_threads
