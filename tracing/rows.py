"""Columnar span batches: every writer appends spans here, promotion happens once, in one place.

A `SpanBatch` collects spans as Python column lists and turns them into a pyarrow table
with `schema.SPAN_SCHEMA` (only that step needs pyarrow, the `store` extra). Promotion (stage,
request flag, outcome, replica, model, tenant, tokens, TTFT, adjusted count) follows the attribute convention
in `schema` and docs/convention.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tracing import schema as S
from tracing.errors import MissingExtra
from tracing.settings import ROWS

if TYPE_CHECKING:
    import pyarrow as pa

_STAGE_SET = frozenset(S.ALL_STAGES)
_OUTCOME_SET = frozenset(S.OUTCOMES)
TIMEOUT_WORDS = ("timeout", "timedout", "deadline")


def attr_str(value: Any) -> str:
    """The stored string form of an attribute value (the same for SDK, OTLP/JSON and protobuf)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, Mapping):
        return json.dumps({k: _jsonable(v) for k, v in value.items()}, separators=(",", ":"))
    if isinstance(value, Sequence):
        return json.dumps([_jsonable(v) for v in value], separators=(",", ":"))
    return str(value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, Mapping):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def first_attr(attrs: Mapping[str, str], keys: Iterable[str]) -> str | None:
    """The first non-empty value among `keys` in `attrs` (the order of a schema key tuple is its precedence)."""
    for key in keys:
        value = attrs.get(key)
        if value is not None and value != "":
            return value
    return None


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def attr_int(text: str | None) -> int | None:
    """An int64 read off an attribute string ("12", "1e3", "12.9" → 12), else None.

    Infinity, NaN and values beyond int64 give None rather than failing the whole batch.
    """
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        try:
            value = int(float(text))
        except (ValueError, OverflowError):
            return None
    return value if _INT64_MIN <= value <= _INT64_MAX else None


#: A duration in seconds as the GenAI conventions write one (a double): a plain non-negative decimal.
SECONDS_TEXT = r"^[0-9]{1,9}([.][0-9]{1,12})?$"
_SECONDS_TEXT = re.compile(SECONDS_TEXT)


def ttft_ns_of(attrs: Mapping[str, str]) -> int | None:
    """The time to first token a span states, in ns: `tailscope.ttft_ns`, else `gen_ai.response.time_to_first_chunk`
    (seconds; times 1e9 as a double, rounded half to even), else None."""
    declared = attr_int(attrs.get(S.ATTR_TTFT_NS))
    if declared is not None:
        return declared
    text = attrs.get(S.ATTR_TIME_TO_FIRST_CHUNK)
    if text is None or not _SECONDS_TEXT.match(text):
        return None
    return round(float(text) * 1e9)


_THRESHOLD = re.compile(rf"[0-9a-f]{{1,{S.THRESHOLD_DIGITS}}}")
_RATE = re.compile(r"[0-9]{1,18}(\.[0-9]{1,18})?")
_TWO56 = 1 << S.THRESHOLD_BITS


def threshold_text(trace_state: str) -> str | None:
    """The `th` value of the `ot` entry of a W3C tracestate ('ot=th:c;rv:...'), None when there is none.

    Members are comma-separated `key=value` (spaces and tabs around them ignored); the first `ot`
    member counts, and in it the first `th:` sub-key.
    """
    if "ot=" not in trace_state:
        return None
    for member in trace_state.split(","):
        key, eq, value = member.strip(" \t").partition("=")
        if eq and key == S.TRACESTATE_OT_KEY:
            for part in value.split(";"):
                sub, colon, text = part.partition(":")
                if colon and sub == S.TRACESTATE_THRESHOLD_KEY:
                    return text
            return None
    return None


def sampling_of(trace_state: str, rate: str | None) -> tuple[float, bool]:
    """(adjusted count, malformed) of a span: its `ot=th` threshold, else its sample-rate attribute, else 1.

    OpenTelemetry consistent probability sampling keeps a span with probability (2^56 - th) / 2^56, th
    written as 1-14 lowercase hex digits right-padded with zeros to 14 (th:0 keeps all); the adjusted
    count is the inverse, float(2^56) / float(2^56 - th). A rate N (Honeycomb's SampleRate: 1 in N kept)
    must be a decimal number >= 1. A threshold or rate that does not read gives 1 and `malformed`.
    """
    text = threshold_text(trace_state)
    if text is not None:
        if not _THRESHOLD.fullmatch(text):
            return 1.0, True
        th = int(text.ljust(S.THRESHOLD_DIGITS, "0"), 16)
        return float(_TWO56) / float(_TWO56 - th), False
    if rate is None:
        return 1.0, False
    if not _RATE.fullmatch(rate):
        return 1.0, True
    value = float(rate)
    return (value, False) if value >= 1.0 else (1.0, True)


def adjusted_count_of(trace_state: str, attrs: Mapping[str, str]) -> float:
    """How many spans this one stands for under sampling (see `sampling_of`; docs/convention.md#sampling)."""
    return sampling_of(trace_state, first_attr(attrs, S.SAMPLE_RATE_KEYS))[0]


def stage_of(name: str, attrs: Mapping[str, str]) -> str | None:
    """The stage a span declares: `tailscope.stage`, else a span name from the vocabulary."""
    declared = attrs.get(S.ATTR_STAGE)
    if declared in _STAGE_SET:
        return declared
    return name if name in _STAGE_SET else None


def is_request(kind: str, stage: str | None, attrs: Mapping[str, str]) -> bool:
    """True for the span that is one inference request (see docs/convention.md)."""
    flag = attrs.get(S.ATTR_REQUEST)
    if flag is not None:
        return flag.lower() == "true"
    return stage is None and kind in ("Server", "Internal") and S.ATTR_OPERATION in attrs


def outcome_of(status_code: str, attrs: Mapping[str, str]) -> str:
    """ok, error, timeout or cancelled: the declared outcome, else one read off the status."""
    declared = attrs.get(S.ATTR_OUTCOME)
    if declared in _OUTCOME_SET:
        return declared
    if status_code != "Error":
        return "ok"
    err = attrs.get(S.ATTR_ERROR_TYPE, "").lower().replace("_", "")
    if any(word in err for word in TIMEOUT_WORDS):
        return "timeout"
    if "cancel" in err:
        return "cancelled"
    return "error"


_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[1-8][0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}$")


def is_random_instance_id(value: str) -> bool:
    """True for a UUID (v1-v8) in `service.instance.id`: what an SDK generates per process, new at each restart."""
    return bool(_UUID.match(value))


def replica_keys() -> tuple[str, ...]:
    """The resource keys tried for the replica: $TAILSCOPE_REPLICA_KEYS (comma-separated) or the default order."""
    keys = tuple(k.strip() for k in ROWS.replica_keys.resolve().split(",") if k.strip())
    return keys or S.REPLICA_RESOURCE_KEYS


def replica_of(resource: Mapping[str, str]) -> str | None:
    """The replica a person knows: the first of `replica_keys()` present on the resource.

    A random UUID in service.instance.id (the OpenTelemetry SDK's per-process default) is passed
    over for the keys after it and used only when no other key is there; it stays readable in
    ResourceAttributes['service.instance.id'] either way.
    """
    fallback = None
    for key in replica_keys():
        value = resource.get(key)
        if value is None or value == "":
            continue
        if key == S.RANDOM_INSTANCE_KEY and is_random_instance_id(value):
            fallback = value
            continue
        return value
    return fallback


class SpanBatch:
    """Spans gathered column by column; `to_table()` gives a table in `SPAN_SCHEMA`."""

    __slots__ = ("_cols",)

    def __init__(self) -> None:
        self._cols: dict[str, list[Any]] = {name: [] for name in S.COLUMN_NAMES}

    def __len__(self) -> int:
        return len(self._cols["SpanId"])

    def append(
        self,
        *,
        trace_id: str,
        span_id: str,
        parent_span_id: str,
        name: str,
        kind: str,
        start_ns: int,
        end_ns: int,
        service: str,
        resource: Mapping[str, str],
        attrs: Mapping[str, str],
        status_code: str = "Unset",
        status_message: str = "",
        trace_state: str = "",
        scope_name: str = "",
        scope_version: str = "",
        events: Sequence[dict[str, Any]] = (),
        links: Sequence[dict[str, Any]] = (),
        replica: str | None = None,
    ) -> None:
        """Add one span; attribute values must already be strings (see `attr_str`)."""
        c = self._cols
        stage = stage_of(name, attrs)
        request = is_request(kind, stage, attrs)
        c["Timestamp"].append(start_ns // 1000)
        c["TimestampNs"].append(start_ns)
        c["TraceId"].append(trace_id)
        c["SpanId"].append(span_id)
        c["ParentSpanId"].append(parent_span_id)
        c["TraceState"].append(trace_state)
        c["SpanName"].append(name)
        c["SpanKind"].append(kind)
        c["ServiceName"].append(service)
        c["ResourceAttributes"].append(list(resource.items()))
        c["ScopeName"].append(scope_name)
        c["ScopeVersion"].append(scope_version)
        c["SpanAttributes"].append(list(attrs.items()))
        c["Duration"].append(end_ns - start_ns)
        c["StatusCode"].append(status_code)
        c["StatusMessage"].append(status_message)
        c["Events"].append(list(events))
        c["Links"].append(list(links))
        c["Stage"].append(stage)
        c["IsRequest"].append(request)
        c["Outcome"].append(outcome_of(status_code, attrs) if request else None)
        c["Replica"].append(replica if replica is not None else replica_of(resource))
        c["Model"].append(first_attr(attrs, S.MODEL_KEYS))
        c["ModelVersion"].append(first_attr(attrs, S.MODEL_VERSION_KEYS))
        c["Tenant"].append(first_attr(attrs, S.TENANT_KEYS))
        c["InputTokens"].append(attr_int(first_attr(attrs, S.INPUT_TOKEN_KEYS)))
        c["OutputTokens"].append(attr_int(first_attr(attrs, S.OUTPUT_TOKEN_KEYS)))
        c["TtftNs"].append(ttft_ns_of(attrs))
        c["AdjustedCount"].append(adjusted_count_of(trace_state, attrs))

    def to_table(self) -> pa.Table:
        """The batch as a pyarrow table in `SPAN_SCHEMA`."""
        try:
            import pyarrow as pa
        except ModuleNotFoundError as exc:
            raise MissingExtra("a span table", exc.name or "pyarrow", "store") from None
        return pa.Table.from_pydict(self._cols, schema=S.SPAN_SCHEMA)

    def clear(self) -> None:
        """Drop every gathered span."""
        for col in self._cols.values():
            col.clear()
