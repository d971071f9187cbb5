"""Write OTLP/JSON the way the OpenTelemetry Collector's file exporter does.

One ExportTraceServiceRequest per line; ids as lowercase hex, enums as integers, 64-bit
integers as decimal strings (the OTLP/JSON rules). Used by the file exporter, the
sample generators and tests.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan

_ID_KEYS = ("traceId", "spanId", "parentSpanId")


def _hex_ids(obj: dict[str, Any]) -> None:
    for key in _ID_KEYS:
        if key in obj:
            obj[key] = base64.b64decode(obj[key]).hex()


def request_to_json(request: ExportTraceServiceRequest) -> dict[str, Any]:
    """The OTLP/JSON object of a protobuf ExportTraceServiceRequest."""
    doc = MessageToDict(request, use_integers_for_enums=True, preserving_proto_field_name=False)
    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                _hex_ids(span)
                for link in span.get("links", []):
                    _hex_ids(link)
    return doc


def spans_to_json_line(spans: Sequence[ReadableSpan]) -> str:
    """One OTLP/JSON line (no trailing newline) holding `spans`, as the file exporter writes it."""
    return json.dumps(request_to_json(encode_spans(spans)), separators=(",", ":"))
