"""Each request's attribute values (the request and stage sources of analysis.stats.attributes), written with the
materialized hours and read back for a report's rows.

Layout: beside an hour's STORE/requests/dt=…/hr=…/requests-<key>.parquet (analysis.engine.materialize) lies
attributes-<key>.arrow, an Arrow IPC file of one batch, one row per row of the requests file, in its order, read
memory-mapped (a column costs nothing until its rows are read). Each attribute key and source has a column named
"<source>/<key>" (`column_name`), dictionary-coded: the hour's distinct values of it, sorted as Python sorts text,
then a null (`hour_codes`); each request's index into them, the null's where it has no value (int16 indices when
they fit). The file's metadata (COLUMNS_KEY) holds, per column, the requests carrying the key and its distinct
values, and the rows per value of keys of at most MAX_COUNTED values: a report judges a key it will not keep (ids,
too many values) from these and its values alone, without reading a code, and counts a key it keeps by its
values (`HourFile`, `StoredColumn`). Keys that are never a dimension whatever the rules (tailscope's own, those
the built-in dimensions read, timing keys: `presence_only`) are written as int8 flags, 0 where present: the
report lists them as skipped, in the order of how many requests carry them, and reads no value of theirs.
The file has the requests file's <key> (the hour's span digests), so it is stale exactly when that one is;
an hour without it (built by an older version, or not materialized) is computed on the fly from the spans,
by the same SQL (`request_attribute_sql`, `stage_attribute_sql`): a report reads the same values either way.
"""

from __future__ import annotations

import fnmatch
import functools
import itertools
import json
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import duckdb
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from analysis.engine import model as M
from tracing import schema as S
from tracing.store import fsync_path, hour_of_dir

I64 = npt.NDArray[np.int64]
#: The sources read per request (the resource source is per replica, read at report time).
REQUEST_SOURCES: Final[tuple[str, ...]] = ("request", "stage")
#: Prefix of tailscope's own attribute keys (the convention's bookkeeping: never a dimension).
OWN_PREFIX: Final = "tailscope."
#: Keys the built-in dimensions are read from (their values are those dimensions already).
BUILTIN_KEYS: Final[dict[str, str]] = {
    **{k: "model" for k in S.MODEL_KEYS}, **{k: "model_version" for k in S.MODEL_VERSION_KEYS},
    **{k: "tenant" for k in S.TENANT_KEYS}, **{k: "input_tokens" for k in S.INPUT_TOKEN_KEYS},
    **{k: "output_tokens" for k in S.OUTPUT_TOKEN_KEYS},
    # process ids the replica rule falls back to: a number per process, never a level of anything
    **{k: "replica" for k in S.REPLICA_RESOURCE_KEYS if k in ("process.pid", "vllm.process_id")}}
#: Keys recording the request's own timing: the latency itself (an effect of whatever made it slow), never a cause.
TIMING_PATTERNS: Final[tuple[str, ...]] = ("*latency*", "*duration*", "*_ns", "*_ms", "*_us", "*_seconds", "*.time_*",
                                           "*time_to_first_token*")
#: Per-hour attribute files, relative to the store; the name's <key> is its requests file's.
ATTRIBUTES_PREFIX: Final = "attributes-"
#: Key-value metadata of an attribute file: JSON [[replica, key, [values]]] of the hour's own spans
#: (`resource_attribute_sql`'s rows).
RESOURCE_KEY: Final = "tailscope.resource"
#: Key-value metadata of an attribute file: JSON {"rows": n, "columns": {column: [rows carrying it, distinct
#: values (0: presence flags)]}} of its code columns.
COLUMNS_KEY: Final = "tailscope.columns"
#: The most distinct values of a key in an hour whose counts the file's metadata holds.
MAX_COUNTED: Final = 4096
#: The attribute file's name ends so (an Arrow IPC file, memory-mapped when read).
ATTRIBUTES_SUFFIX: Final = ".arrow"
#: A column of nulls, so the file has its rows whatever else it holds.
ROWS_COLUMN: Final = "rows"


_NUMPY: Final[dict[pa.DataType, type]] = {
    pa.int8(): np.int8, pa.int16(): np.int16, pa.int32(): np.int32, pa.int64(): np.int64, pa.uint8(): np.uint8,
    pa.uint16(): np.uint16, pa.uint32(): np.uint32, pa.uint64(): np.uint64, pa.float32(): np.float32,
    pa.float64(): np.float64}


def to_numpy(a: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A primitive Arrow array without nulls (booleans too) as numpy, read-only: pyarrow's own `to_numpy` imports
    pandas (about 0.14 CPU-s a process), which nothing else of the report needs."""
    if isinstance(a, pa.ChunkedArray):
        a = a.chunk(0) if a.num_chunks == 1 else a.combine_chunks()
    if pa.types.is_boolean(a.type):
        return to_numpy(pc.cast(a, pa.uint8())).view(np.bool_)
    if a.null_count:
        raise ValueError(f"an array of {a.type} with {a.null_count} nulls")
    dt = np.dtype(_NUMPY[a.type])
    if len(a) == 0 or a.buffers()[1] is None:
        return np.zeros(0, dtype=dt)
    return np.frombuffer(a.buffers()[1], dtype=dt, count=len(a), offset=a.offset * dt.itemsize)


def from_numpy(x: np.ndarray) -> pa.Array:
    """int64 numbers as an Arrow array (indices for `take`), without pa.array (which imports pandas)."""
    x = np.ascontiguousarray(x, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), x.size, [None, pa.py_buffer(x)])


def strings(items: Sequence[str]) -> pa.Array:
    """Text as an Arrow string array, without pa.array (which imports pandas)."""
    data = [str(t).encode() for t in items]
    offsets = np.zeros(len(data) + 1, dtype=np.int32)
    np.cumsum([len(b) for b in data], out=offsets[1:])
    return pa.Array.from_buffers(pa.string(), len(data), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(data))])


def timing_pattern(key: str) -> str | None:
    """The TIMING_PATTERNS pattern `key` matches (case-insensitively), or None."""
    return next((p for p in TIMING_PATTERNS if fnmatch.fnmatchcase(key.lower(), p)), None)


def presence_only(key: str) -> bool:
    """Whether a key is never a dimension whatever the rules (its presence is all a report reads of it)."""
    return key.startswith(OWN_PREFIX) or key in BUILTIN_KEYS or timing_pattern(key) is not None


def grouped_sql(long_sql: str, source: str) -> str:
    """DuckDB SQL of (k, v, rids) over `request_attribute_sql`'s (rid, a) (`source` "request") or
    `stage_attribute_sql`'s (rid, k, v) answer: each key's distinct values, each with the row ids holding it, ordered
    by key (`split_grouped` cuts each key's rows out as slices); an entry without a value is no value. Each distinct
    value crosses to Python once, with its rows as integers, instead of once per request: at 10 M spans with 40
    request attributes, reading the maps whole took gigabytes."""
    entries = (f"SELECT rid, unnest(map_keys(a)) AS k, unnest(map_values(a)) AS v FROM ({long_sql})"
               if source == "request" else f"SELECT rid, k, v FROM ({long_sql})")
    return f"SELECT k, v, list(rid) AS rids FROM ({entries}) WHERE v IS NOT NULL GROUP BY k, v ORDER BY k"


def split_grouped(table: pa.Table) -> dict[str, tuple[I64, np.ndarray, pa.Array | None]]:
    """key -> (row ids, codes, values) of `grouped_sql`'s answer: each row id's value is values[code], `values`
    the key's distinct values (None for a presence-only key: counted, never coded). A row id appears once a key
    (the request SQL reads one copy of a request span stored twice). Each key's rows are runs of the answer's
    batches (put in key order where they are not), so its row ids, codes and values are slices of them: gathering
    or copying the answer cost about as much as reading it (most of it the system's, allocating fresh memory)."""
    runs: dict[str, list[tuple[I64, np.ndarray, pa.Array]]] = {}
    for batch in table.to_batches():
        if batch.num_rows == 0:
            continue
        keys = pc.dictionary_encode(batch.column(0))
        kidx = to_numpy(keys.indices)
        if np.any(kidx[1:] < kidx[:-1]):  # not in key order: one gather puts it so
            order = np.argsort(kidx, kind="stable")
            batch, kidx = batch.take(from_numpy(order)), kidx[order]
        lists = batch.column(2)
        offsets = to_numpy(lists.offsets).astype(np.int64)
        flat = to_numpy(lists.values).astype(np.int64, copy=False)  # the offsets index the child array (a slice's too)
        vals = batch.column(1)
        names = keys.dictionary.to_pylist()
        cut = np.flatnonzero(kidx[1:] != kidx[:-1]) + 1
        for a, b in itertools.pairwise([0, *cut.tolist(), int(kidx.size)]):
            kind = np.int16 if b - a < np.iinfo(np.int16).max else np.int32  # a code per row: the smallest that holds
            codes = np.repeat(np.arange(b - a, dtype=kind), np.diff(offsets[a:b + 1]))
            # the key's values copied out: a slice would hold the whole answer until every key is judged
            values = pa.concat_arrays([vals.slice(a, b - a)])
            runs.setdefault(str(names[kidx[a]]), []).append((flat[offsets[a]:offsets[b]], codes, values))
    out: dict[str, tuple[I64, np.ndarray, pa.Array | None]] = {}
    for key, got in runs.items():
        if len(got) == 1:
            rids, codes, values = got[0]
        else:  # a key's run split across batches: its values numbered on
            shift = np.cumsum([0] + [len(v) for _, _, v in got])
            kind = np.int16 if shift[-1] < np.iinfo(np.int16).max else np.int32
            rids = np.concatenate([r for r, _, _ in got])
            codes = np.concatenate([np.add(c, s, dtype=kind) for (_, c, _), s in zip(got, shift, strict=False)])
            values = pa.concat_arrays([v for _, _, v in got])
        if not pa.types.is_string(values.type):
            values = values.cast(pa.string())
        out[key] = (rids, codes, None if presence_only(key) else values)
    return out


def column_name(source: str, key: str) -> str:
    """The attribute file's column of a key of a source."""
    return f"{source}/{key}"


def request_attribute_sql(facts_rows: str, spans: str = "spans") -> str:
    """DuckDB SQL of (rid, a): the attribute map of each request's own span, one row per request: of a span stored
    more than once, the copy the request model reads (analysis.engine.model.COPY_ORDER, the map last) among the
    copies starting in the request's hour (the hour the model reads it from);
    `facts_rows` is a query of the facts rows (rid, trace_id, span_id, start_ns); $lo / $hi bound the span start
    times read. The copies are found among the request spans' ids first (no map read), so only they are ordered:
    a window over every request's map cost three times the read."""
    hour = M.HOUR_NS

    def within(ts: str) -> str:
        return f"($lo IS NULL OR {ts} >= $lo) AND ($hi IS NULL OR {ts} < $hi)"

    copies = (f"SELECT TraceId, SpanId FROM {spans} WHERE IsRequest AND {within('TimestampNs')} "
              "GROUP BY ALL HAVING count(*) > 1")
    joined = (f"FROM ({facts_rows}) f JOIN {spans} s ON s.TraceId = f.trace_id AND s.SpanId = f.span_id "
              f"AND s.TimestampNs // {hour} = f.start_ns // {hour} WHERE s.IsRequest AND {within('s.TimestampNs')}")
    again = "(s.TraceId, s.SpanId) IN (SELECT (TraceId, SpanId) FROM copies)"
    return (f"WITH copies AS ({copies}) "
            f"SELECT f.rid, s.SpanAttributes AS a {joined} AND NOT {again} UNION ALL "
            f"SELECT rid, a FROM (SELECT f.rid, s.SpanAttributes AS a, {M.copy_columns_sql(M.DUCKDB, 's')} {joined} "
            f"AND {again}) QUALIFY row_number() OVER (PARTITION BY rid ORDER BY "
            f"{M.copy_order_sql((M.DUCKDB, 'a'))}) = 1")


def stage_attribute_sql(facts_rows: str, spans: str = "spans") -> str:
    """DuckDB SQL of (rid, k, v): each key of a request's stage spans (the spans of its trace with a stage starting in
    its hour or the hour on each side, the spans its request model reads) that they all agree on; $lo / $hi (the
    frame's span time bounds, None: the whole store) only narrow the scan: the request's hours bound the spans.
    Whether a span is read depends on its start's hour alone, so the spans' values are first reduced to their least
    and greatest per trace, hour and key: the join then holds a row per trace and key, not per span (at 10 M spans
    the per-span join passed 1.5 GB). Traces are matched by a 64-bit hash of their id, as the request model matches
    spans (analysis.engine.model)."""
    hour = M.HOUR_NS
    return (f"WITH f AS ({facts_rows}), "
            f"st AS (SELECT hash(TraceId) AS t, TimestampNs // {hour} AS hb, unnest(map_keys(SpanAttributes)) AS k, "
            f"unnest(map_values(SpanAttributes)) AS v FROM {spans} WHERE Stage IS NOT NULL AND NOT IsRequest "
            "AND hash(TraceId) IN (SELECT hash(trace_id) FROM f) "
            f"AND len(list_filter(map_keys(SpanAttributes), lambda x: NOT starts_with(x, '{OWN_PREFIX}'))) > 0 "
            f"AND ($lo IS NULL OR TimestampNs >= ($lo // {hour}) * {hour} - {hour}) "
            f"AND ($hi IS NULL OR TimestampNs < (($hi - 1) // {hour}) * {hour} + {2 * hour})), "
            f"sh AS (SELECT t, hb, k, min(v) AS lo_v, max(v) AS hi_v FROM st WHERE NOT starts_with(k, '{OWN_PREFIX}') "
            "GROUP BY t, hb, k) "
            "SELECT f.rid, sh.k, min(sh.lo_v) AS v FROM f JOIN sh ON sh.t = hash(f.trace_id) "
            f"AND {M.in_read_hours_sql(f'sh.hb * {hour}', 'f.start_ns')} "
            "GROUP BY f.rid, sh.k HAVING min(sh.lo_v) = max(sh.hi_v)")


def resource_attribute_sql(spans: str = "spans", where: str = "TRUE") -> str:
    """DuckDB SQL of (replica, k, vs): each replica's resource keys and their distinct values, over its request and
    worker-stage spans (the serving process) in `spans` meeting `where`; $lo / $hi bound the span start times read."""
    worker = ", ".join(f"'{s}'" for s in M.WORKER_STAGES)
    return ("SELECT Replica, k, list(DISTINCT v) AS vs FROM (SELECT Replica, unnest(map_keys(ResourceAttributes)) "
            f"AS k, unnest(map_values(ResourceAttributes)) AS v FROM {spans} WHERE Replica IS NOT NULL "
            f"AND (IsRequest OR Stage IN ({worker})) AND ({where}) "
            "AND ($lo IS NULL OR TimestampNs >= $lo) AND ($hi IS NULL OR TimestampNs < $hi)) "
            f"WHERE NOT starts_with(k, '{OWN_PREFIX}') GROUP BY Replica, k")


def attributes_path(requests_file: Path) -> Path:
    """The attribute file beside a materialized requests file (the same <key>)."""
    return requests_file.with_name(ATTRIBUTES_PREFIX + requests_file.name.removeprefix("requests-").removesuffix(
        ".parquet") + ATTRIBUTES_SUFFIX)


def hour_codes(rows: npt.NDArray[np.integer], codes: np.ndarray, values: pa.Array, n: int) -> pa.DictionaryArray:
    """A key's values on `rows` of `n` rows (row `rows[i]` holds `values[codes[i]]`) as a dictionary array without
    nulls: the distinct values some row holds, sorted (as Python sorts text), then a null; each row's index into them
    (the null's where it has no value); int16 indices when they fit."""
    held = np.flatnonzero(np.bincount(codes, minlength=len(values)))
    if held.size < len(values):  # a value only a second delivery held: not the hour's
        lut = np.full(len(values), -1, dtype=np.int64)
        lut[held] = np.arange(held.size)
        values, codes = values.take(from_numpy(held)), lut[codes]
    d = len(values)
    order = to_numpy(pc.sort_indices(values)).astype(np.int64)
    kind, typ = (np.int16, pa.int16()) if d < np.iinfo(np.int16).max else (np.int32, pa.int32())
    rank = np.empty(d, dtype=kind)
    rank[order] = np.arange(d, dtype=kind)
    out = np.full(n, d, dtype=kind)
    out[rows] = rank[codes]
    return pa.DictionaryArray.from_arrays(pa.Array.from_buffers(typ, n, [None, pa.py_buffer(out)]),
                                          pa.concat_arrays([values.take(from_numpy(order)),
                                                            pa.nulls(1, pa.string())]))


def write_hour(con: duckdb.DuckDBPyConnection, spans: str, hour_ns: int, requests_file: Path, final: Path) -> Path:
    """Write the attribute file of the requests in `requests_file` (read from `spans`, a FROM item of the spans
    its requests were built from) as `final`, with the resource values of the replicas in the spans starting in
    the hour `hour_ns` in its metadata (RESOURCE_KEY); crash-safe (temp, fsync, rename)."""
    facts = (f"SELECT file_row_number AS rid, trace_id, span_id, start_ns FROM "
             f"read_parquet({M.quote(str(requests_file))}, file_row_number = true, hive_partitioning = false)")
    # the hour's requests' spans start in it (the stage spans' rule reads the hour on each side of it)
    bounds: dict[str, int | None] = {"lo": hour_ns, "hi": hour_ns + M.HOUR_NS}
    resource = con.sql(resource_attribute_sql(spans), params=bounds).fetchall()
    table = _coded_table(con, facts, {"request": request_attribute_sql(facts, spans),
                                      "stage": stage_attribute_sql(facts, spans)}, bounds, resource)
    tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        _write_table(table, tmp)
        fsync_path(tmp)
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return final


def write_live(con: duckdb.DuckDBPyConnection, facts_table: str, path: Path,
               values: Mapping[str, str] | None = None) -> Path:
    """Write, as `path`, the attribute file of the stale hours' requests in `facts_table` (connect.keep_live_facts's
    table: a row's `rid` is its row in the file), from the values kept in LIVE_VALUES (`keep_live_values`; or the
    tables `values` it filled): the file a materialized hour has, so a report codes the live rows as it codes a
    stored hour's (`stored_values`), instead of reading and splitting their values again. Its resource rows stay in
    LIVE_VALUES (per hour)."""
    facts = f"SELECT rid, trace_id, span_id, start_ns FROM {facts_table}"
    sqls = {source: live_values_sql(source, facts, LIVE_VALUES if values is None else values)
            for source in REQUEST_SOURCES}
    _write_table(_coded_table(con, facts, sqls, {"lo": None, "hi": None}, []), path)
    return path


def _coded_table(con: duckdb.DuckDBPyConnection, facts: str, sqls: dict[str, str], params: dict[str, int | None],
                 resource: list[tuple[str, str, list[str]]]) -> pa.Table:
    """The attribute file's table (LAYOUT) of the rows of `facts` (rid: the row in the file), each source's values
    read by its SQL in `sqls` (with `params`); `resource`: the replicas' rows for the metadata."""
    n = int(con.execute(f"SELECT count(*) FROM ({facts})").fetchall()[0][0])
    columns: dict[str, pa.Array] = {ROWS_COLUMN: pa.nulls(n, pa.int8())}
    about: dict[str, list[int]] = {}
    counts: dict[str, list[int]] = {}
    for source, sql in sqls.items():
        by_key = split_grouped(con.sql(grouped_sql(sql, source), params=params).to_arrow_table())
        for key in sorted(by_key):
            rows, codes, values = by_key.pop(key)
            name = column_name(source, key)
            if values is None:  # presence only: 0 where present, 1 elsewhere
                flags = np.ones(n, dtype=np.int8)
                flags[rows] = 0
                columns[name] = pa.Array.from_buffers(pa.int8(), n, [None, pa.py_buffer(flags)])
                about[name] = [int(rows.size), 0]
                continue
            columns[name] = coded = hour_codes(rows, codes, values, n)
            d = len(coded.dictionary) - 1
            about[name] = [int(rows.size), d]
            if d <= MAX_COUNTED:
                counts[name] = np.bincount(to_numpy(coded.indices), minlength=d + 1)[:d].tolist()
    meta = {RESOURCE_KEY: json.dumps(sorted([str(r), str(k), sorted(map(str, vs))] for r, k, vs in resource)),
            COLUMNS_KEY: json.dumps({"rows": n, "columns": about, "counts": counts}, sort_keys=True)}
    return pa.table(columns).replace_schema_metadata(meta)


def _write_table(table: pa.Table, path: Path) -> None:
    """An attribute file's table as one Arrow IPC batch."""
    with ipc.new_file(str(path), table.schema) as writer:
        writer.write_table(table, max_chunksize=max(table.num_rows, 1))


#: Changes whenever the file's layout or the rules of the values it holds change (a part of every hour's key).
LAYOUT: Final = ("attributes 2: Arrow IPC, one batch, one row per request; <source>/<key> dictionary-coded, the "
                 "hour's distinct values sorted then a null (no value), int8 presence flags, counts in the metadata "
                 f"(per value up to {MAX_COUNTED}); "
                 ) + request_attribute_sql("f", "spans") + stage_attribute_sql("f", "spans") + ",".join(
                     sorted(BUILTIN_KEYS)) + ",".join(TIMING_PATTERNS)


class HourFile:
    """One hour's attribute file, memory-mapped: a column costs nothing until its rows are read."""

    def __init__(self, path: Path) -> None:
        reader = ipc.open_file(pa.memory_map(str(path)), options=ipc.IpcReadOptions(use_threads=False))
        meta = reader.schema.metadata or {}
        about = json.loads(meta[COLUMNS_KEY.encode()])
        self.rows: int = int(about["rows"])
        #: code column -> (rows carrying the key, distinct values: 0 for presence flags)
        self.columns: dict[str, tuple[int, int]] = {k: (int(p), int(d)) for k, (p, d) in about["columns"].items()}
        #: code column -> rows per distinct value (of the keys of at most MAX_COUNTED values)
        self.counts: dict[str, list[int]] = about["counts"]
        self.resource: list[tuple[str, str, list[str]]] = [
            (str(r), str(k), [str(v) for v in vs]) for r, k, vs in json.loads(meta.get(RESOURCE_KEY.encode(), b"[]"))]
        self.batch = reader.get_batch(0) if reader.num_record_batches == 1 else None
        if self.batch is None or self.batch.num_rows != self.rows:
            raise ValueError(f"{path}: not one batch of {self.rows} rows")

    def column(self, name: str) -> pa.Array:
        """One column."""
        assert self.batch is not None
        return self.batch.column(name)


@dataclass
class StoredColumn:
    """A key of a source in one materialized hour, for the frame's rows of that hour: `positions` (frame positions)
    are the file's `rows` (None: every row of the file, in order)."""

    hour: HourFile
    name: str
    positions: I64
    rows: I64 | None

    @functools.cached_property
    def codes(self) -> npt.NDArray[np.int8] | npt.NDArray[np.int16] | npt.NDArray[np.int32]:
        """Each frame row's index into `values` (len(values): no value), aligned with `positions`."""
        col = self.hour.column(self.name)
        codes = to_numpy(col.indices if isinstance(col, pa.DictionaryArray) else col)
        return codes if self.rows is None else codes[self.rows]

    @functools.cached_property
    def present(self) -> int:
        """How many of the frame's rows carry the key."""
        if self.rows is None:
            return self.hour.columns[self.name][0]
        return int(np.count_nonzero(self.codes < len(self.values)))

    @property
    def counts(self) -> I64 | None:
        """Rows per value of `values` when the file counts them for the frame's rows (all the file's rows)."""
        got = self.hour.counts.get(self.name) if self.rows is None else None
        return None if got is None else np.array(got, dtype=np.int64)

    @functools.cached_property
    def values(self) -> pa.Array:
        """The hour's distinct values of the key, sorted (every one held by a frame row when `rows` is None)."""
        col = self.hour.column(self.name)
        if not isinstance(col, pa.DictionaryArray):  # presence flags: 0 present, 1 not
            return pa.nulls(1, pa.string())
        return col.dictionary.slice(0, self.hour.columns[self.name][1])


@dataclass
class StoredValues:
    """The attribute values of the frame's rows read from attribute files: by source, key -> its columns;
    `live_where` picks (SQL on `rid`) the rows to read from the spans."""

    by_source: dict[str, dict[str, list[StoredColumn]]] = field(default_factory=dict)
    live_where: str = "TRUE"
    #: whether no frame row is left to read from the spans
    all_stored: bool = False
    #: hour -> the resource rows (replica, key, values) of its own spans, of every hour with an attribute file
    resource: dict[int, list[tuple[str, str, list[str]]]] = field(default_factory=dict)
    #: the spans the rows `live_where` picks are read from: `spans`, or LIVE_SPANS when they are all rows of the
    #: stale hours (every stored file read: those hours' requests come from exactly those spans)
    live_spans: str = "spans"
    #: whether the rows `live_where` picks (then the stale hours' rows) are read from LIVE_VALUES, not the spans
    live_kept: bool = False


#: The view of a connection (analysis.engine.connect) over the segments the stale hours' requests read.
LIVE_SPANS: Final = "_spans_live"

#: Tables a reader keeps itself (the dashboard's workbench, `keep_live_values`): the stale hours' request and stage
#: attribute values by request (trace_id, span_id) and their resource rows, each row with its hour.
LIVE_VALUES: Final = {"request": "_attribute_values_live_request", "stage": "_attribute_values_live_stage",
                      "resource": "_attribute_values_live_resource"}


def keep_live_values(con: duckdb.DuckDBPyConnection, rows: str, gone: Sequence[int], hours: Sequence[int], *,
                     spans: str = "spans", live_spans: str = LIVE_SPANS, into: Mapping[str, str] = LIVE_VALUES,
                     staged: Mapping[str, str] | None = None) -> None:
    """Keep in LIVE_VALUES (or `into`) the stale hours' attribute values, as `read_attributes` reads them from
    LIVE_SPANS (`live_spans`; the resource rows from `spans`): drop the `gone` hours' rows and add those of `hours`,
    whose requests `rows` (a table with trace_id, span_id, start_ns) holds. Call on a connection whose views were
    just pointed (connect.refresh) at the snapshot whose stale hours these are, or with views of that snapshot's
    files under other names; the values do not depend on the report's time range (a request's spans are bounded by
    its hours). `staged`: tables this function filled (`into`) with the `hours`' values, on another cursor (beside
    the hours' critical paths): their rows are moved into LIVE_VALUES, not read again, and the tables dropped."""
    hour = M.HOUR_NS
    have = {t for (t,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE NOT temporary").fetchall()}
    for table in into.values():
        if gone and table in have:
            con.execute(f"DELETE FROM {table} WHERE hour IN (SELECT unnest(?))", [list(gone)])
    if staged is not None:
        for name, table in into.items():
            if table in have and con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]:
                con.execute(f"INSERT INTO {table} SELECT * FROM {staged[name]}")
                con.execute(f"DROP TABLE {staged[name]}")
                continue
            # nothing of the other hours to keep (every stale hour recomputed): the staged table becomes the kept
            # one, renamed, not copied (the request maps of a big live hour cost a tenth of a CPU-second to copy)
            if table in have:
                con.execute(f"DROP TABLE {table}")
            con.execute(f"ALTER TABLE {staged[name]} RENAME TO {table}")
        return
    keys = "SELECT * FROM _live_value_keys"
    con.execute("CREATE OR REPLACE TEMP TABLE _live_value_keys AS SELECT row_number() OVER () AS rid, trace_id, "
                f"span_id, start_ns FROM {rows} WHERE start_ns // {hour} * {hour} IN (SELECT unnest(?))",
                [list(hours)])
    # a request's row, keyed by its ids and its hour (a span stored twice, once in each of two hours, is two requests)
    keyed = "JOIN _live_value_keys k USING (rid)"
    for h in hours:
        in_hour = f"{keys} WHERE start_ns >= {h} AND start_ns < {h + hour}"
        for name, sql in (
                ("request", f"SELECT {h}::BIGINT AS hour, k.trace_id, k.span_id, s.a FROM "
                            f"({request_attribute_sql(in_hour, live_spans)}) s {keyed}"),
                ("resource", f"SELECT {h}::BIGINT AS hour, Replica AS replica, k, vs FROM "
                             f"({resource_attribute_sql(spans, f'TimestampNs >= {h} AND TimestampNs < {h + hour}')})"
                             )):
            # the hour's bounds narrow the scan only (its requests' spans start in it), as a report's time range does
            _keep_into(con, into[name], sql, {"lo": h, "hi": h + hour}, have)
    # the stage values of a run of consecutive hours in one query: a request's stage spans are those of its trace in
    # its hour and the hour on each side (whatever the other rows), so an hour's query read its neighbours' spans again
    for lo, hi in M.hour_runs(hours):
        in_run = f"{keys} WHERE start_ns >= {lo} AND start_ns < {hi}"
        _keep_into(con, into["stage"], f"SELECT k.start_ns // {hour} * {hour} AS hour, k.trace_id, k.span_id, s.k, "
                                       f"s.v FROM ({stage_attribute_sql(in_run, live_spans)}) s {keyed}",
                   {"lo": lo, "hi": hi}, have)
    con.execute("DROP TABLE _live_value_keys")


def _keep_into(con: duckdb.DuckDBPyConnection, table: str, sql: str, params: dict[str, int], have: set[str]) -> None:
    """Add the rows of `sql` to `table`, made by this query when it is not in `have` (then added to it)."""
    if table in have:
        con.execute(f"INSERT INTO {table} {sql}", params)
    else:
        con.execute(f"CREATE TABLE {table} AS {sql}", params)
        have.add(table)


def live_values_sql(source: str, live_rows: str, values: Mapping[str, str] = LIVE_VALUES) -> str:
    """SQL of `read_attributes`' long table of `source` ("request": (rid, a), "stage": (rid, k, v)) for `live_rows`
    (rid, trace_id, span_id, start_ns), from the values kept in LIVE_VALUES (or the tables `values`)."""
    cols = "c.a" if source == "request" else "c.k, c.v"
    # $lo / $hi bound the requests' start (their request span's), as the spans' SQL bounds the spans it reads
    # a request's values are those of its hour (a span stored twice, once in each of two hours, is two requests)
    return (f"SELECT f.rid, {cols} FROM ({live_rows}) f JOIN {values[source]} c "
            "ON c.trace_id = f.trace_id AND c.span_id = f.span_id "
            f"AND c.hour = f.start_ns // {M.HOUR_NS} * {M.HOUR_NS} "
            "WHERE ($lo IS NULL OR f.start_ns >= $lo) AND ($hi IS NULL OR f.start_ns < $hi)")


#: A view of the stored request files a connection reads, (n, path): their rows' ids are n << ROW_ID_FILE_SHIFT | row.
FILES_VIEW: Final = "_request_files_stored"
#: A view of the stale hours' attribute file a reader wrote (`write_live`), (path): at most one row; its rows are the
#: live request facts' row ids (file number 0). Empty unless the reader points it at one (`live_file_sql`).
LIVE_FILE_VIEW: Final = "_attribute_file_live"


def live_file_sql(path: Path | None) -> str:
    """SQL of LIVE_FILE_VIEW: the stale hours' attribute file `path` (None: none)."""
    return f"SELECT {M.quote(str(path))} AS path" if path is not None else "SELECT NULL::VARCHAR AS path WHERE false"


def files_view_sql(stored: list[str]) -> str:
    """SQL of FILES_VIEW over the stored request files (numbered from 1, as their rows' ids are)."""
    if not stored:
        return "SELECT NULL::BIGINT AS n, NULL::VARCHAR AS path WHERE false"
    return "SELECT * FROM (VALUES " + ", ".join(f"({i}, {M.quote(f)})" for i, f in enumerate(stored, 1)) + \
        ") t(n, path)"


_NO_ROWS: Final = np.zeros(0, dtype=np.int64)


def _rows_by_file(file_of: I64) -> dict[int, I64]:
    """{file number: the positions of its rows, ascending} (`np.flatnonzero(file_of == n)` for each n present): one
    stable sort, cheap on the frame's few runs of one file each, instead of a pass over every row per file."""
    order = np.argsort(file_of, kind="stable")
    ordered = file_of[order]
    cuts = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
    bounds = [0, *cuts.tolist(), int(ordered.size)]
    return {int(ordered[a]): order[a:b] for a, b in itertools.pairwise(bounds) if b > a}


def stored_values(con: duckdb.DuckDBPyConnection, frame_rid: I64, shift: int) -> StoredValues | None:
    """The request and stage attribute columns of the frame's rows (store row ids: file number << `shift` | row)
    whose hour has an attribute file (read lazily, a column when asked); None when the connection reads no stored
    hour."""
    try:
        files = con.execute(f"SELECT n, path FROM {FILES_VIEW}").fetchall()
    except duckdb.Error:
        return None
    out = StoredValues(by_source={s: {} for s in REQUEST_SOURCES})
    in_file = _rows_by_file(frame_rid >> shift)
    covered: list[int] = []
    live = [(0, Path(p)) for (p,) in con.execute(f"SELECT path FROM {LIVE_FILE_VIEW}").fetchall()]
    for number, attr in [(n, attributes_path(Path(p))) for n, p in files] + live:
        positions = in_file.get(int(number), _NO_ROWS)
        rows = frame_rid[positions] & ((1 << shift) - 1)
        try:  # a file swept since the snapshot (or unreadable): its hour's values are read from the spans
            hour = HourFile(attr)
        except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
            continue
        if rows.size and int(rows.max()) >= hour.rows:
            continue  # not the rows of this requests file
        covered.append(int(number))
        if number:  # the live file's resource rows are kept per hour (LIVE_VALUES), read below
            out.resource[hour_of_dir(attr.parent)] = hour.resource
        if not positions.size:
            continue
        whole = rows.size == hour.rows and bool(np.all(rows[1:] > rows[:-1])) and int(rows[0]) == 0
        for name in hour.columns:
            source, _, key = name.partition("/")
            col = StoredColumn(hour, name, positions, None if whole else rows)
            out.by_source.setdefault(source, {}).setdefault(key, []).append(col)
    if not covered:
        return out
    out.live_where = f"(rid >> {shift}) NOT IN ({', '.join(map(str, covered))})"
    out.all_stored = set(in_file) <= set(covered)
    if len(set(covered) - {0}) == len(files) and con.execute(  # the rows left are the stale hours' (file number 0)
            "SELECT count(*) FROM duckdb_views() WHERE view_name = ?", [LIVE_SPANS]).fetchall()[0][0]:
        out.live_spans = LIVE_SPANS
        if con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = ?",
                       [LIVE_VALUES["resource"]]).fetchall()[0][0]:
            out.live_kept = True
            for h, rep, key, vs in con.execute(f"SELECT hour, replica, k, vs FROM {LIVE_VALUES['resource']}"
                                               ).fetchall():
                out.resource.setdefault(int(h), []).append((str(rep), str(key), [str(v) for v in vs]))
    return out


def resource_rows(con: duckdb.DuckDBPyConnection, stored: StoredValues | None, lo: int | None, hi: int | None
                  ) -> list[tuple[str, str, list[str]]]:
    """`resource_attribute_sql`'s rows over the spans starting in [lo, hi) (None: unbounded): the hours inside
    it with an attribute file from the file (their distinct values merged), the others from the spans."""
    hour = M.HOUR_NS
    inside = sorted(h for h in (stored.resource if stored is not None else {})
                    if (lo is None or h >= lo) and (hi is None or h + hour <= hi))
    where = " AND ".join(f"NOT (TimestampNs >= {h} AND TimestampNs < {h + hour})" for h in inside) or "TRUE"
    found: dict[tuple[str, str], set[str]] = {}
    for rep, key, vs in con.sql(resource_attribute_sql("spans", where), params={"lo": lo, "hi": hi}).fetchall():
        found.setdefault((str(rep), str(key)), set()).update(map(str, vs))
    for h in inside:
        assert stored is not None
        for rep, key, vs in stored.resource[h]:
            found.setdefault((rep, key), set()).update(vs)
    return [(rep, key, sorted(vs)) for (rep, key), vs in found.items()]
