"""OTLP/gRPC front end: `opentelemetry.proto.collector.trace.v1.TraceService/Export` on grpcio.

The method is registered with no deserializer, so the handler gets the raw request bytes
and decodes them exactly as the HTTP front end does. Status codes: INVALID_ARGUMENT for
malformed requests, UNAUTHENTICATED without the bearer token, RESOURCE_EXHAUSTED over
the size cap (grpcio enforces it after decompression), UNAVAILABLE (retryable) when the
queue is full or the receiver is stopping.

The token is checked on the call's metadata before the message is asked for: grpcio's
server reads a unary request message as soon as a unary handler is chosen (grpcio
_server.py `_handle_unary_unary` starts a ReceiveMessage operation; the message-size cap is
enforced only once the whole message is in, grpc/grpc#43012), so a call without the token
gets a request-streaming handler that aborts without reading. What such a client can still
make the server hold is what HTTP/2 flow control lets it send before the refusal: one stream
window, kept at 64 KiB by turning off BDP probing (below). An authenticated call's message
is read whole before the handler runs: at most `grpc_workers` such messages of up to
`max_body_bytes` are read at once (a call waiting for a thread has not asked for its message
yet, so it holds one window too), and calls beyond `grpc_workers x 4` are refused at once
(RESOURCE_EXHAUSTED) before anything is read.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

from intake.collect.commit import Closed, QueueFull
from intake.collect.decode import PROTOBUF, success_body
from intake.collect.intake import Busy, Intake
from intake.peer import peer_host

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"


def _abort(context: Any, intake: Intake, code: grpc.StatusCode, message: str) -> None:
    if code is grpc.StatusCode.UNAVAILABLE:
        intake.refused()
    else:
        intake.bad()
    context.abort(code, message)


UNAUTHENTICATED = "missing or wrong bearer token: send metadata 'authorization: Bearer <token>'"


class _Gate(grpc.GenericRpcHandler):
    """Chooses the handler of a call from its method and metadata, before any message is read."""

    def __init__(self, intake: Intake, export: grpc.RpcMethodHandler, refuse: grpc.RpcMethodHandler) -> None:
        self.intake = intake
        self.export = export
        self.refuse = refuse

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if handler_call_details.method != f"/{SERVICE}/Export":  # type: ignore[attr-defined]
            return None  # UNIMPLEMENTED
        metadata = dict(handler_call_details.invocation_metadata or ())  # type: ignore[attr-defined]
        return self.export if self.intake.authorized(metadata.get("authorization")) else self.refuse


def make_server(intake: Intake, host: str, port: int) -> tuple[grpc.Server, int]:
    """A started-able grpc.Server serving TraceService/Export, and its bound port."""
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

    def refuse(requests: Any, context: Any) -> bytes:
        """An unauthenticated call: answered without asking for its message."""
        _abort(context, intake, grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED)
        raise AssertionError("unreachable")

    handler = _Gate(intake,
                    grpc.unary_unary_rpc_method_handler(export, request_deserializer=None, response_serializer=None),
                    grpc.stream_unary_rpc_method_handler(refuse, request_deserializer=None, response_serializer=None))
    server = grpc.server(
        ThreadPoolExecutor(max_workers=config.grpc_workers, thread_name_prefix="tailscope-grpc"),
        handlers=(handler,),
        options=[
            ("grpc.max_receive_message_length", config.max_body_bytes),
            ("grpc.max_send_message_length", 4 << 20),
            ("grpc.so_reuseport", 0),
            # no BDP probing: a stream's window stays at HTTP/2's initial 64 KiB until the handler asks
            # for the message (a pending read opens it to the message's size), so a refused call holds
            # kilobytes, not the megabytes a probed window lets a client send unasked (measured in
            # benchmarks/bench_grpc_unauth.py: 8 clients x 3 x 60 MiB refused, +26 MiB peak with
            # probing, +2 MiB without; 2.7 MiB authenticated bodies were no slower on loopback)
            ("grpc.http2.bdp_probe", 0),
        ],
        maximum_concurrent_rpcs=config.grpc_workers * 4,
    )
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    bound = server.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"could not bind gRPC to {host}:{port}")
    return server, bound
