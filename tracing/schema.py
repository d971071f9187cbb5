"""The one owner of the stored span schema, the stage vocabulary and the attribute convention.

Writers (the tracing exporter, `tailscope ingest`, `tailscope collect`) and readers
(`analysis`) both import this module, so a column or a stage name is defined once.
Columns follow the OpenTelemetry Collector ClickHouse exporter's `otel_traces` table
with portable Parquet types; a few promoted columns make the request model cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

# --- the stage vocabulary -------------------------------------------------------------

#: The stage names, one constant each: code elsewhere spells a stage through these, never as a literal.
NETWORK: Final = "network"
QUEUE_WAIT: Final = "queue_wait"
PREPROCESS: Final = "preprocess"
MODEL_LOAD: Final = "model_load"
GENERATION: Final = "generation"
PREFILL: Final = "prefill"
DECODE: Final = "decode"
STREAMING: Final = "streaming"
#: The critical-path column of the time no stage covers.
OTHER: Final = "other"
#: Top-level stages of one inference request, in pipeline order.
STAGES: Final[tuple[str, ...]] = (NETWORK, QUEUE_WAIT, PREPROCESS, MODEL_LOAD, GENERATION, STREAMING)
#: Stages that live inside `generation` when the data splits it.
GENERATION_PARTS: Final[tuple[str, ...]] = (PREFILL, DECODE)
#: Every stage name a span may declare.
ALL_STAGES: Final[tuple[str, ...]] = STAGES + GENERATION_PARTS
#: The parent stage of a nested stage.
STAGE_PARENT: Final[dict[str, str]] = {PREFILL: GENERATION, DECODE: GENERATION}
#: Stage columns of the `requests` view, in order; they sum exactly to `e2e_ns`.
CRITICAL_PATH_COLUMNS: Final[tuple[str, ...]] = (
    NETWORK, QUEUE_WAIT, PREPROCESS, MODEL_LOAD, GENERATION, PREFILL, DECODE, STREAMING, OTHER)
#: Stages that own only the instants no other stage holds (the stream waits on generation).
YIELDING_STAGES: Final[tuple[str, ...]] = (STREAMING,)
#: Request outcomes; failures are counted, never dropped.
OUTCOMES: Final[tuple[str, ...]] = ("ok", "error", "timeout", "cancelled")

# --- the attribute convention -----------------------------------------------------------
# Plain OpenTelemetry code (no tailscope import) follows the same convention: see
# docs/convention.md. GenAI semantic-convention keys are used where one exists.

ATTR_REQUEST: Final = "tailscope.request"  # "true" on the span that is one inference request
ATTR_STAGE: Final = "tailscope.stage"  # one of ALL_STAGES on a stage span
ATTR_OUTCOME: Final = "tailscope.outcome"  # one of OUTCOMES on the request span
ATTR_TTFT_NS: Final = "tailscope.ttft_ns"  # integer ns from request start to first token
ATTR_TENANT: Final = "tailscope.tenant"
ATTR_MODEL_VERSION: Final = "tailscope.model.version"
ATTR_STREAMING: Final = "gen_ai.request.stream"
ATTR_OPERATION: Final = "gen_ai.operation.name"
ATTR_ERROR_TYPE: Final = "error.type"
ATTR_SYNTHETIC: Final = "tailscope.synthetic"  # "true" on a stage span derived from an engine's native trace
ATTR_ENGINE: Final = "tailscope.engine"  # the serving engine a mapped request came from (vllm, sglang, tgi, triton)
ATTR_ENGINE_EVIDENCE: Final = "tailscope.engine.evidence"  # why a mapper claimed the span (scope, service, ...)
ATTR_DERIVED_FROM: Final = "tailscope.derived_from"  # the native field(s) or span a synthetic stage span was laid from

# The OpenTelemetry GenAI conventions as of open-telemetry/semantic-conventions @953276ff
# (model/gen-ai/registry.yaml and deprecated/registry-deprecated.yaml: the last commit before they moved to
# open-telemetry/semantic-conventions-genai, keys unchanged; docs/convention.md#genai). Where a key replaced
# another, the current one comes first.
#: The GenAI provider ("openai", "aws.bedrock", ...): `gen_ai.provider.name`, which renamed `gen_ai.system`.
PROVIDER_KEYS: Final[tuple[str, ...]] = ("gen_ai.provider.name", "gen_ai.system")
#: Why generation stopped, one per choice (a string array, stored as its JSON text); abort, cancel and error
#: read as outcomes.
ATTR_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
#: Input tokens served from a cache: the convention's key, then the key vLLM and SGLang write (no convention's).
CACHED_INPUT_TOKEN_KEYS: Final[tuple[str, ...]] = ("gen_ai.usage.cache_read.input_tokens", "gen_ai.usage.cached_tokens")
#: Seconds (a double) from the request to the first chunk of a streamed response: the request's TTFT when
#: `tailscope.ttft_ns` is absent.
ATTR_TIME_TO_FIRST_CHUNK: Final = "gen_ai.response.time_to_first_chunk"

#: Keys tried in order for each promoted field (first present wins).
MODEL_KEYS: Final[tuple[str, ...]] = ("gen_ai.request.model", "gen_ai.response.model")
MODEL_VERSION_KEYS: Final[tuple[str, ...]] = (ATTR_MODEL_VERSION, "gen_ai.request.model.version")
TENANT_KEYS: Final[tuple[str, ...]] = (ATTR_TENANT, "tenant.id", "enduser.id")
INPUT_TOKEN_KEYS: Final[tuple[str, ...]] = ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens")
OUTPUT_TOKEN_KEYS: Final[tuple[str, ...]] = (
    "gen_ai.usage.output_tokens",
    "gen_ai.usage.completion_tokens",
)
#: Span attributes giving a sampling rate N (1 in N kept, adjusted count N), tried in order when the
#: TraceState holds no `ot=th` threshold: Honeycomb's `SampleRate`, and `sampling.rate` in the same sense.
SAMPLE_RATE_KEYS: Final[tuple[str, ...]] = ("SampleRate", "sampling.rate")
#: The OpenTelemetry TraceState entry and its sub-key holding the consistent-sampling rejection threshold.
TRACESTATE_OT_KEY: Final = "ot"
TRACESTATE_THRESHOLD_KEY: Final = "th"
#: Thresholds are 56-bit integers written as 1 to 14 lowercase hex digits, right-padded with zeros.
THRESHOLD_BITS: Final = 56
THRESHOLD_DIGITS: Final = 14

#: The replica name a person gives a process (resource attribute); wins over everything else.
ATTR_REPLICA: Final = "tailscope.replica"
#: The address of the peer that sent a batch to `tailscope collect` (added to the resource).
ATTR_PEER: Final = "tailscope.peer"
#: Resource keys tried in order for the replica (first present wins; docs/convention.md#replica).
#: Names that survive a restart come first; `service.instance.id` is skipped here when it is a
#: random UUID (what OpenTelemetry SDKs generate per process) and used only as a late fallback
#: (`RANDOM_INSTANCE_KEY`), below the sending peer's address.
REPLICA_RESOURCE_KEYS: Final[tuple[str, ...]] = (
    ATTR_REPLICA,
    "k8s.pod.name",
    "host.name",
    "service.instance.id",
    ATTR_PEER,
    "process.pid",
    "vllm.process_id",  # vLLM's own resource key (docs/engines.md)
)
#: The per-process key whose random-UUID values come last (after every key above).
RANDOM_INSTANCE_KEY: Final = "service.instance.id"

# --- enum spellings as stored (the ClickHouse exporter's strings) -----------------------

SPAN_KINDS: Final[tuple[str, ...]] = (
    "Unspecified",
    "Internal",
    "Server",
    "Client",
    "Producer",
    "Consumer",
)
STATUS_CODES: Final[tuple[str, ...]] = ("Unset", "Ok", "Error")

# --- the Parquet schema -----------------------------------------------------------------
# Column names and meanings are plain data; the Arrow types are built on first use (PEP 562
# module __getattr__), so serving code importing the vocabulary never loads pyarrow.

#: (column, type kind, meaning) for every stored column, in stored order.
COLUMN_DOCS: Final[tuple[tuple[str, str, str], ...]] = (
    ("Timestamp", "timestamp", "span start, UTC, microseconds"),
    ("TimestampNs", "int64", "span start, integer ns since the Unix epoch"),
    ("TraceId", "string", "32 lowercase hex digits"),
    ("SpanId", "string", "16 lowercase hex digits"),
    ("ParentSpanId", "string", "16 lowercase hex digits, '' for a root span"),
    ("TraceState", "string", "W3C tracestate, '' when absent"),
    ("SpanName", "string", "span name"),
    ("SpanKind", "string", "Unspecified, Internal, Server, Client, Producer or Consumer"),
    ("ServiceName", "string", "resource service.name"),
    ("ResourceAttributes", "attrs", "resource attributes, values as strings"),
    ("ScopeName", "string", "instrumentation scope name"),
    ("ScopeVersion", "string", "instrumentation scope version"),
    ("SpanAttributes", "attrs", "span attributes, values as strings"),
    ("Duration", "int64", "end minus start, integer ns"),
    ("StatusCode", "string", "Unset, Ok or Error"),
    ("StatusMessage", "string", "status description"),
    ("Events", "events", "span events (TimestampNs, Name, Attributes)"),
    ("Links", "links", "span links (TraceId, SpanId, TraceState, Attributes)"),
    ("Stage", "string", "promoted: the stage this span measures (vocabulary), else null"),
    ("IsRequest", "bool", "promoted: true on the span that is one inference request"),
    ("Outcome", "string", "promoted, request spans: ok, error, timeout or cancelled"),
    ("Replica", "string", "promoted: tailscope.replica, else k8s.pod.name, host.name, ... "
     "(order: docs/convention.md#replica)"),
    ("Model", "string", "promoted: gen_ai.request.model"),
    ("ModelVersion", "string", "promoted: tailscope.model.version"),
    ("Tenant", "string", "promoted: tailscope.tenant"),
    ("InputTokens", "int64", "promoted: gen_ai.usage.input_tokens (or prompt_tokens)"),
    ("OutputTokens", "int64", "promoted: gen_ai.usage.output_tokens (or completion_tokens)"),
    ("TtftNs", "int64", "promoted: time to first token in ns, when the span states it (tailscope.ttft_ns, else "
     "gen_ai.response.time_to_first_chunk in seconds)"),
    ("AdjustedCount", "float64", "promoted: how many spans this one stands for (1 / sampling probability): "
     "ot=th in TraceState, else a SAMPLE_RATE_KEYS attribute, else 1 (docs/convention.md#sampling)"),
)
COLUMN_NAMES: Final[tuple[str, ...]] = tuple(name for name, _, _ in COLUMN_DOCS)

if TYPE_CHECKING:
    import pyarrow as pa

    ATTRS: pa.DataType
    EVENT: pa.StructType
    LINK: pa.StructType
    SPAN_COLUMNS: tuple[tuple[str, pa.DataType, str], ...]
    SPAN_SCHEMA: pa.Schema

_ARROW: dict[str, Any] = {}


def _arrow_objects() -> dict[str, Any]:
    if not _ARROW:
        import pyarrow as pa

        attrs = pa.map_(pa.string(), pa.string())
        event = pa.struct([("TimestampNs", pa.int64()), ("Name", pa.string()), ("Attributes", attrs)])
        link = pa.struct([("TraceId", pa.string()), ("SpanId", pa.string()), ("TraceState", pa.string()),
                          ("Attributes", attrs)])
        types = {"timestamp": pa.timestamp("us", tz="UTC"), "int64": pa.int64(), "float64": pa.float64(),
                 "string": pa.string(),
                 "bool": pa.bool_(), "attrs": attrs, "events": pa.list_(event), "links": pa.list_(link)}
        columns = tuple((name, types[kind], meaning) for name, kind, meaning in COLUMN_DOCS)
        _ARROW.update(ATTRS=attrs, EVENT=event, LINK=link, SPAN_COLUMNS=columns,
                      SPAN_SCHEMA=pa.schema([(name, typ) for name, typ, _ in columns]))
    return _ARROW


def empty_span_table() -> pa.Table:
    """A table of no spans in SPAN_SCHEMA, built from no batches (pyarrow's `Schema.empty_table()` imports pandas:
    about a second at a command's start)."""
    import pyarrow as pa

    return pa.Table.from_batches([], schema=_arrow_objects()["SPAN_SCHEMA"])


def __getattr__(name: str) -> Any:
    """The Arrow types (ATTRS, EVENT, LINK, SPAN_COLUMNS, SPAN_SCHEMA), built on first use."""
    if name in ("ATTRS", "EVENT", "LINK", "SPAN_COLUMNS", "SPAN_SCHEMA"):
        return _arrow_objects()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: Segment store layout: STORE/spans/dt=YYYY-MM-DD/hr=HH/<writer>-<seq>.parquet
SPANS_DIR: Final = "spans"
SEGMENT_GLOB: Final = "spans/*/*/*.parquet"
STORE_MARKER: Final = "tailscope-store.json"
STORE_FORMAT_VERSION: Final = 1
