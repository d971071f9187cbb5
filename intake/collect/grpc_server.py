"""OTLP/gRPC front end: `opentelemetry.proto.collector.trace.v1.TraceService/Export` on grpcio.

The method is registered with no deserializer, so the handler gets the raw request bytes
and decodes them exactly as the HTTP front end does. Status codes: INVALID_ARGUMENT for
malformed requests, UNAUTHENTICATED without the bearer token, RESOURCE_EXHAUSTED over
the size cap (grpcio enforces it after decompression), UNAVAILABLE (retryable) when the
queue is full or the receiver is stopping.
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


def make_server(intake: Intake, host: str, port: int) -> tuple[grpc.Server, int]:
    """A started-able grpc.Server serving TraceService/Export, and its bound port."""
    config = intake.config

    def export(request: bytes, context: Any) -> bytes:
        metadata = {k: v for k, v in context.invocation_metadata()}
        if not intake.authorized(metadata.get("authorization")):
            _abort(context, intake, grpc.StatusCode.UNAUTHENTICATED,
                   "missing or wrong bearer token: send metadata 'authorization: Bearer <token>'")
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

    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {"Export": grpc.unary_unary_rpc_method_handler(export, request_deserializer=None,
                                                       response_serializer=None)},
    )
    server = grpc.server(
        ThreadPoolExecutor(max_workers=config.grpc_workers, thread_name_prefix="tailscope-grpc"),
        handlers=(handler,),
        options=[
            ("grpc.max_receive_message_length", config.max_body_bytes),
            ("grpc.max_send_message_length", 4 << 20),
            ("grpc.so_reuseport", 0),
        ],
        maximum_concurrent_rpcs=config.grpc_workers * 4,
    )
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    bound = server.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"could not bind gRPC to {host}:{port}")
    return server, bound
