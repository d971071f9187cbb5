"""Request bodies to span tables: content types, gzip with a cap, OTLP decode, responses.

Shared by the HTTP and gRPC front ends so both store the same spans for the same bytes.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass

import pyarrow as pa
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from intake.otlp import DecodeResult, base_of, decode_json_request, decode_protobuf_base
from tracing.errors import BadRequest
from tracing.rows import SpanBatch

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
ENCODINGS = (PROTOBUF, JSON)


class TooLarge(BadRequest):
    """The body (after decompression) is over the configured cap: HTTP 413."""


class BadEncoding(BadRequest):
    """A Content-Encoding the receiver does not speak: HTTP 415."""


@dataclass
class Decoded:
    """A decoded request: the spans to store (None when there are none) and the counts."""

    table: pa.Table | None
    result: DecodeResult


def media_type(content_type: str | None) -> str:
    """The bare, lowercased media type of a Content-Type header ('' when absent)."""
    return (content_type or "").split(";", 1)[0].strip().lower()


def gunzip_capped(data: bytes, cap: int) -> bytes:
    """Decompress gzip `data` (one or more members), stopping at `cap` bytes: TooLarge beyond it.

    A gzip bomb costs at most `cap` bytes of memory and the time to inflate them.
    """
    out: list[bytes] = []
    total = 0
    rest = data
    while True:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            chunk = d.decompress(rest, cap - total + 1)
        except zlib.error as exc:
            raise ValueError(f"corrupt gzip body ({exc})") from None
        total += len(chunk)
        if total > cap:
            raise TooLarge(f"body is over the {cap:,}-byte limit after gzip decompression")
        out.append(chunk)
        if not d.eof:
            if d.unconsumed_tail:  # output stopped at the cap with input left: over the limit
                raise TooLarge(f"body is over the {cap:,}-byte limit after gzip decompression")
            raise ValueError("truncated gzip body (the compressed stream ends early)")
        rest = d.unused_data
        if not rest.strip(b"\x00"):
            return b"".join(out)


def decompress(data: bytes, content_encoding: str | None, cap: int) -> bytes:
    """The body after Content-Encoding (identity or gzip), capped at `cap` bytes."""
    enc = (content_encoding or "identity").strip().lower()
    if enc in ("", "identity"):
        if len(data) > cap:
            raise TooLarge(f"body of {len(data):,} bytes is over the {cap:,}-byte limit")
        return data
    if enc in ("gzip", "x-gzip"):
        return gunzip_capped(data, cap)
    raise BadEncoding(f"Content-Encoding {content_encoding!r} is not supported; send gzip or identity")


def decode_body(data: bytes, encoding: str) -> Decoded:
    """Decode an OTLP ExportTraceServiceRequest body; ValueError (400) when it is malformed.

    The table is in `otlp.BASE_SCHEMA`: the committer promotes a whole group at once.
    """
    if encoding == PROTOBUF:
        table, result = decode_protobuf_base(data)
        return Decoded(table if table.num_rows else None, result)
    batch = SpanBatch()
    result = decode_json_request(data, batch)
    return Decoded(base_of(batch.to_table()) if len(batch) else None, result)


def partial_message(result: DecodeResult) -> str:
    """The partial_success error_message for the spans of `result` that were rejected."""
    reasons = "; ".join(result.errors[:3])
    more = "" if len(result.errors) <= 3 else f" (and {result.rejected - 3} more)"
    return f"{result.rejected} span(s) rejected: {reasons}{more}"


def success_body(result: DecodeResult, encoding: str) -> bytes:
    """An ExportTraceServiceResponse, with partial_success when some spans were rejected."""
    if encoding == JSON:
        if not result.rejected:
            return b"{}"
        return json.dumps({"partialSuccess": {"rejectedSpans": str(result.rejected),
                                              "errorMessage": partial_message(result)}}).encode()
    response = ExportTraceServiceResponse()
    if result.rejected:
        response.partial_success.rejected_spans = result.rejected
        response.partial_success.error_message = partial_message(result)
    return response.SerializeToString()


#: HTTP status → google.rpc.Code of the Status body.
_RPC_CODE = {400: 3, 401: 16, 404: 5, 405: 12, 411: 3, 413: 8, 415: 3, 429: 8, 431: 3, 500: 13, 503: 14}


def status_body(status: int, message: str, encoding: str) -> bytes:
    """A google.rpc.Status error body in the request's encoding (JSON when it is unknown)."""
    code = _RPC_CODE.get(status, 2)
    if encoding == PROTOBUF:
        return status_pb2.Status(code=code, message=message).SerializeToString()
    return json.dumps({"code": code, "message": message}).encode()
