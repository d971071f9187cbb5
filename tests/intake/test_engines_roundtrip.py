"""Engine traces survive the trip: what the mappers promote can be read back from the attributes alone.

A ClickHouse `otel_traces` table (the Collector's exporter) or any OTLP backend keeps span and
resource attributes but none of tailscope's promoted columns. So for every engine fixture and
every committed sample: normalize as `ingest`/`collect` do, drop every promoted column (Replica
too) and promote again from the attributes, by both rule sets (the vectorised `otlp.promote`
with `rows.replica_of`, and `rows.SpanBatch.append` one span at a time). Both must give the
very same columns, and a store of the re-promoted spans the very same `requests` rows.

A committed sample's spans are those `ingest` stored (the segments of its store in tests/samples_cache.py,
which other files ingest too): decoded and normalized by ingest itself, the same table as decoding the file here
and normalizing it, without decoding each sample a second time.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import ModuleType

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from intake.engines import normalize, read_json_array
from intake.ingest import IngestReport
from intake.otlp import PROMOTED_COLUMNS, base_of, decode_json, promote
from intake.peer import with_peer
from sample_traces import tgi_incident, triton_incident
from sample_traces.generate import DURATION_S, RATE
from sample_traces.incidents import run
from tests import samples_cache
from tests.intake.engine_fixtures import FIXTURES, TRITON_OFFSET, requests
from tracing import schema as S
from tracing.rows import SpanBatch, replica_of
from tracing.store import SegmentWriter, init_store, segment_files

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces" / "data"
#: Every column a trip through otel_traces loses and promotion must give back.
LOST = (*PROMOTED_COLUMNS, "Replica")


def _lines_table(lines: list[bytes], peer: str | None = None) -> pa.Table:
    batch = SpanBatch()
    for line in lines:
        if line.strip():
            decode_json(line, batch)
    return with_peer(batch.to_table(), peer)


def _file_table(path: Path) -> pa.Table:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    if path.suffix == ".json":
        [table] = read_json_array(path, data, skip_bad=False, report=IngestReport())
        return table
    return _lines_table(data.splitlines())


def _incident_table(module: ModuleType) -> pa.Table:
    """A bare-resource engine incident as `collect --record-peer` receives it: one peer per replica."""
    scenario = run("slow_replica", tgi_incident.SEED, DURATION_S, RATE)
    by_address = module.lines_by_address(scenario.requests)
    return pa.concat_tables([_lines_table([x.encode() for x in lines], addr) for addr, lines in by_address.items()])


def _decoded(path: Path, factory: pytest.TempPathFactory) -> pa.Table:
    """An engine fixture's spans, decoded here and normalized."""
    return normalize(_file_table(path))


def _stored(sample: Path, factory: pytest.TempPathFactory) -> pa.Table:
    """The spans `ingest` stored of a committed sample (already normalized): its shared store's segments."""
    return pa.concat_tables([pq.read_table(f) for f in segment_files(samples_cache.store(sample, factory))])


#: case -> its spans as `ingest` / `collect` store them: decoded here and normalized, or a committed sample's store
CASES: dict[str, Callable[[pytest.TempPathFactory], pa.Table]] = {
    **{f"fixture:{p.name}": partial(_decoded, p) for p in sorted(FIXTURES.iterdir())
       if p.name.endswith((".otlp.jsonl", ".json"))},
    **{f"sample:{p.relative_to(SAMPLES)}": partial(_stored, p) for p in sorted(SAMPLES.rglob("*.otlp.jsonl.gz"))},
    "sample:tgi_incident": lambda _: normalize(_incident_table(tgi_incident)),
    "sample:triton_incident": lambda _: normalize(_incident_table(triton_incident)),
}
#: Cases whose traces hold engine spans (the others are native: the mappers leave them as they are).
ENGINE_CASES = [k for k in CASES if k.startswith("fixture:") or "engines/" in k or k.endswith("_incident")]


def _lost_columns(table: pa.Table) -> pa.Table:
    """The columns a trip loses, as one table (compared whole with `equals`: types, values and nulls, in order)."""
    return table.select(list(LOST)).combine_chunks()


def _resource_replicas(resources: pa.ChunkedArray) -> pa.Array:
    """`replica_of` of each span's resource, asked once per distinct resource: the resources are told apart by
    their (key, value) pairs in order, joined into one text per span in Arrow (a null map reads as an empty one,
    as `dict(r or ())` reads it), so no span is turned into Python objects; the first span of each distinct
    text gives the resource asked about."""
    both = resources.combine_chunks()
    pairs = pc.binary_join_element_wise(both.keys, both.items, "\x00", null_handling="replace",
                                        null_replacement="\x02")
    per_span = pa.ListArray.from_arrays(both.offsets, pairs)  # offsets into the whole child, as keys and items
    codes = pc.binary_join(per_span, "\x01").dictionary_encode()
    firsts = pc.index_in(pa.array(range(len(codes.dictionary)), pa.int32()), codes.indices)
    asked = [replica_of(dict(both[i].as_py() or ())) for i in firsts.to_pylist()]
    return pc.take(pa.array(asked, pa.string()), codes.indices)


def _vectorised(table: pa.Table) -> pa.Table:
    """otlp.promote on the base columns, Replica from the resource (what a backend keeps: `replica_of` of each
    span's resource, `_resource_replicas`)."""
    base = base_of(table)
    replicas = _resource_replicas(table.column("ResourceAttributes"))
    base = base.set_column(base.schema.get_field_index("Replica"), "Replica", replicas)
    return promote(base)


def _row_wise(table: pa.Table) -> pa.Table:
    """rows.SpanBatch.append on each span's attributes and resource: the rule set `promote` vectorises."""
    batch = SpanBatch()
    read = ["TraceId", "SpanId", "ParentSpanId", "SpanName", "SpanKind", "TimestampNs", "Duration", "ServiceName",
            "ResourceAttributes", "SpanAttributes", "StatusCode"]  # only these become Python objects
    for r in table.select(read).to_pylist():
        batch.append(trace_id=r["TraceId"], span_id=r["SpanId"], parent_span_id=r["ParentSpanId"],
                     name=r["SpanName"], kind=r["SpanKind"], start_ns=r["TimestampNs"],
                     end_ns=r["TimestampNs"] + r["Duration"], service=r["ServiceName"],
                     resource=dict(r["ResourceAttributes"] or ()), attrs=dict(r["SpanAttributes"] or ()),
                     status_code=r["StatusCode"])
    return batch.to_table()


_CACHE: dict[str, pa.Table] = {}


def _normalized(name: str, factory: pytest.TempPathFactory) -> pa.Table:
    """The case's spans as `ingest` / `collect` store them (normalized), built once per module."""
    if name not in _CACHE:
        mp = pytest.MonkeyPatch()
        mp.setenv("TAILSCOPE_TRITON_CLOCK_OFFSET_NS", str(TRITON_OFFSET))
        try:
            _CACHE[name] = CASES[name](factory)
        finally:
            mp.undo()
    return _CACHE[name]


_AGAIN: dict[str, pa.Table] = {}


def _repromoted(name: str, factory: pytest.TempPathFactory) -> pa.Table:
    """The case's spans promoted again from their attributes alone (`_vectorised`), once per module: three tests
    read it."""
    if name not in _AGAIN:
        _AGAIN[name] = _vectorised(_normalized(name, factory))
    return _AGAIN[name]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_promoted_columns_come_back_from_the_attributes_alone(name: str,
                                                              tmp_path_factory: pytest.TempPathFactory) -> None:
    table = _normalized(name, tmp_path_factory)
    assert table.num_rows > 0
    want = _lost_columns(table)
    assert _lost_columns(_repromoted(name, tmp_path_factory)).equals(want), name
    if name in ENGINE_CASES:
        # the other rule set too (one span at a time: too slow for the native samples, which the
        # mappers leave as decoded, that is as SpanBatch.append promoted them)
        assert _lost_columns(_row_wise(table)).equals(want), name
        # the trip is not vacuous: engine requests were recognised and mapped
        assert pc.any(want.column("IsRequest")).as_py() and want.column("Stage").null_count < want.num_rows, name


@pytest.mark.slow
@pytest.mark.parametrize("name", ENGINE_CASES)
def test_a_second_mapping_changes_nothing(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """What arrives mapped (a forwarded copy, a re-ingest) is taken as native: no request is mapped twice,
    no partner root or inner handler becomes a request of its own."""
    table = _normalized(name, tmp_path_factory)
    again = normalize(_repromoted(name, tmp_path_factory))
    assert _by_key(again).equals(_by_key(table)), name


def _by_key(table: pa.Table) -> pa.Table:
    """The table's rows in (TraceId, SpanId) order (compared whole with `equals`: schema, values and nulls)."""
    return table.sort_by([("TraceId", "ascending"), ("SpanId", "ascending")]).combine_chunks()


@pytest.mark.parametrize("name", ENGINE_CASES)
def test_requests_rows_are_the_same_from_the_attributes_alone(name: str, tmp_path: Path,
                                                              tmp_path_factory: pytest.TempPathFactory) -> None:
    table = _normalized(name, tmp_path_factory)
    rows = []
    for label, t in (("as-stored", table), ("re-promoted", _repromoted(name, tmp_path_factory))):
        store = init_store(tmp_path / label)
        SegmentWriter(store, kind="ingest", durable=False).write(t)
        rows.append(requests(store))
    assert rows[0] and rows[0] == rows[1], name


@pytest.mark.parametrize("name", ENGINE_CASES)
def test_engine_facts_are_span_attributes(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The request span states its facts, a synthetic span its stage, origin and engine."""
    table = _normalized(name, tmp_path_factory)
    for r in table.select(["SpanAttributes", "ResourceAttributes", "Stage", "Replica", "IsRequest", "Outcome",
                           "TtftNs"]).to_pylist():
        attrs = dict(r["SpanAttributes"] or ())
        if S.ATTR_ENGINE not in attrs:
            continue
        if attrs.get(S.ATTR_SYNTHETIC) == "true":
            assert attrs[S.ATTR_STAGE] == r["Stage"] and attrs[S.ATTR_DERIVED_FROM], (name, attrs)
            assert dict(r["ResourceAttributes"] or ()).get(S.ATTR_REPLICA, r["Replica"]) == r["Replica"]
        elif r["IsRequest"]:
            assert attrs[S.ATTR_REQUEST] == "true" and attrs[S.ATTR_OUTCOME] == r["Outcome"], (name, attrs)
            assert attrs.get(S.ATTR_TTFT_NS) == (None if r["TtftNs"] is None else str(r["TtftNs"])), (name, attrs)
