"""Materialized requests: the request model (analysis.engine.model) written once per hour as Parquet.

Layout: STORE/requests/dt=YYYY-MM-DD/hr=HH/requests-<key>.parquet holds the requests whose
request span starts in that hour, sorted by start_ns. A request reads spans from its own
hour and the hour on each side (the model's rule), so the file is built from the span
segments of those three hours, and <key> is a hash of their digests (tracing.store.list_hour: a
sum of per-segment hashes that compaction preserves, so merging segments into one holding the same
spans keeps the file fresh): when a segment lands in any of them (late spans, a request crossing
the hour boundary), the key changes and the file is stale. The file's key-value metadata
(ENGINES_KEY) counts the hour's request spans by engine, so the report's coverage line reads no
span of a materialized hour. Beside it, attributes-<key>.arrow holds each of its requests' attribute
values (analysis.engine.attribute_values), written before the requests file, swept with it. A reader
(analysis.engine.connect) uses the file whose key matches the segments it sees and computes
every other hour on the fly, so a query never depends on this having run. Files are
written to a hidden temporary name, fsynced and renamed: readers see the old file or the
new one, never half. Superseded files are removed GRACE_S after they were superseded, so a
connection opened earlier keeps reading its own snapshot meanwhile.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from analysis.engine import attribute_values as AV
from analysis.engine import gpu_sweep as GS
from analysis.engine import model as M
from analysis.engine.views import files_source, spans_sql, spill_to_temp
from analysis.kernel import load_kernel
from analysis.mapping import rules as mapping_rules
from tracing import schema as S
from tracing.store import fsync_path, hour_of_dir, list_store, require_store

#: Directory of the materialized requests inside a store.
REQUESTS_DIR = "requests"
#: Materialized request files, relative to the store.
REQUESTS_GLOB = f"{REQUESTS_DIR}/dt=*/hr=*/requests-*.parquet"
#: Seconds a superseded file is kept for connections that still list it.
GRACE_S = 600.0
#: Rows per Parquet row group: a time predicate skips the groups outside it.
ROW_GROUP_ROWS = 16_384
#: zstd level of the request files: level 1 wrote the 2 M-span store's hours in about half the CPU of
#: DuckDB's default (3) for a file 1 % larger (docs/benchmarks.md).
ZSTD_LEVEL = 1
#: `collect` builds an hour once the hour after it has ended this long ago (spans arriving later rebuild it).
SETTLE_NS = 5 * 60 * 1_000_000_000

HOUR_NS = M.HOUR_NS
#: Parquet key-value metadata of a request file: JSON {engine: request spans} of the hour's own segments.
ENGINES_KEY = "tailscope.engines"
#: Changes whenever the request model's SQL or the file's layout changes (rules, columns, metadata).
MODEL_FINGERPRINT = hashlib.sha256((M.requests_sql("spans") + ENGINES_KEY + AV.LAYOUT + GS.COST_LAYOUT
                                    + "".join(GS.sweep_sql(grid=True).values())).encode()).hexdigest()


def engine_counts_sql(source: str, mapping: mapping_rules.Mapping | None = None) -> str:
    """Request spans by `tailscope.engine` (engine, n) in `source` (stored spans): what `tailscope report` says it
    recognised; with a `mapping`, its requests count as `map`."""
    engine = f"SpanAttributes['{S.ATTR_ENGINE}']" if mapping is None else mapping.engine_sql()
    return (f"SELECT {engine} AS engine, count(*) AS n FROM {mapping_rules.project(source, mapping)} "
            "WHERE IsRequest AND engine IS NOT NULL GROUP BY engine")


def partition_dir(store: Path, hour_ns: int) -> Path:
    """STORE/requests/dt=YYYY-MM-DD/hr=HH of an hour."""
    dt = datetime.fromtimestamp(hour_ns // 1_000_000_000, UTC)
    return Path(store) / REQUESTS_DIR / f"dt={dt:%Y-%m-%d}" / f"hr={dt:%H}"


@dataclass
class Snapshot:
    """The store's segments and materialized request files at one moment, and which hours are fresh."""

    store: Path
    segments: list[Path]
    by_hour: dict[int, list[Path]]
    fresh: dict[int, Path] = field(default_factory=dict)
    stale: list[int] = field(default_factory=list)
    #: each hour's digest (tracing.store.HourListing.digest): it follows the set of spans written, not file names
    digests: dict[int, int] = field(default_factory=dict)
    #: The store's mapping (analysis.mapping) when it has one: part of every hour's key and of its spans.
    mapping: mapping_rules.Mapping | None = None

    def key(self, hour_ns: int) -> str:
        """Hash of the model's SQL and of the digests of the hours an hour's requests are built from
        (`hours_read`): it changes whenever a segment lands in (or retention removes one from) any of them,
        but not when compaction merges segments into one holding the same spans (its digest is the sum of
        theirs); a file built by another version of the model is stale too. The one staleness rule: the
        dashboard keys its own rows of an hour by it."""
        h = hashlib.sha256(MODEL_FINGERPRINT.encode())
        if self.mapping is not None:
            h.update(self.mapping.fingerprint().encode())
        for k in hours_read(hour_ns):
            if self.by_hour.get(k):
                h.update(f"{k}/{self.digests[k]:032x}\n".encode())
        return h.hexdigest()[:24]

    def inputs(self, hours: list[int]) -> list[Path]:
        """The segments needed to compute the requests of `hours` (and to draw one of their traces)."""
        want = {k for h in hours for k in hours_read(h)}
        return [f for h in sorted(want) for f in self.by_hour.get(h, [])]


def hour_of(ns: int) -> int:
    """The hour (ns since the epoch) holding the instant `ns`."""
    return (ns // HOUR_NS) * HOUR_NS


def hours_read(hour_ns: int) -> tuple[int, ...]:
    """The hours whose spans the requests of `hour_ns` read (model.READ_HOURS: its own and each neighbour)."""
    return tuple(hour_ns + d * HOUR_NS for d in M.READ_HOURS)


def snapshot(store: Path | str) -> Snapshot:
    """List the segments and request files now; an hour is fresh when its file's key matches its segments."""
    store = Path(store)
    segments: list[Path] = []
    by_hour: dict[int, list[Path]] = {}
    digests: dict[int, int] = {}
    for listing in list_store(store):
        if listing.files:
            hour = hour_of_dir(listing.directory)
            by_hour[hour] = listing.files
            digests[hour] = listing.digest
            segments.extend(listing.files)
    snap = Snapshot(store, segments, by_hour, digests=digests, mapping=mapping_rules.load(store))
    built: dict[int, set[str]] = {}
    for f in store.glob(REQUESTS_GLOB):
        built.setdefault(hour_of_dir(f.parent), set()).add(f.name)
    for hour in sorted(by_hour):
        name = f"requests-{snap.key(hour)}.parquet"
        if name in built.get(hour, set()):
            snap.fresh[hour] = partition_dir(store, hour) / name
        else:
            snap.stale.append(hour)
    return snap


def stored_source(files: list[Path] | list[str]) -> str:
    """A FROM item reading materialized request files (the `requests` columns)."""
    listed = ", ".join(M.quote(str(f)) for f in files)
    return f"read_parquet([{listed}], hive_partitioning = false)"


def hour_where(hours: list[int]) -> str:
    """SQL condition on span columns: the span starts in one of `hours`."""
    if not hours:
        return "FALSE"
    return "(" + " OR ".join(f"(TimestampNs >= {a} AND TimestampNs < {b})" for a, b in M.hour_runs(hours)) + ")"


def _hour_source(snap: Snapshot, hour_ns: int) -> tuple[str, str]:
    """(source, request_where) of one hour's requests: the spans of `snap.inputs([hour_ns])`, its request spans."""
    files = [str(f) for f in snap.inputs([hour_ns])]
    if not files:
        raise ValueError(f"no segment holds spans of the hour at {hour_ns} or its neighbours")
    return f"({spans_sql(files_source(files), snap.mapping)})", hour_where([hour_ns])


def _span_bound(con: duckdb.DuckDBPyConnection, source: str, hour_ns: int, lo: int | None, hi: int | None) -> str:
    """The stage spans that can overlap requests spanning [lo, hi): the model's own bounds on the stage spans
    (`< max(request end)`, `end > min(request start)`) as literals, so that the scan skips most of the next hour;
    and, as the start's bound that the scan prunes by, no earlier than the longest span of `source` starting
    before `lo` (in the hours read) reaches back from it: an earlier span ends before `lo`. So the scan skips most
    of the hour before too (a near-empty hour's requests read a few minutes of it, not all of it)."""
    if hi is None or lo is None:
        return "FALSE"
    first = min(hours_read(hour_ns))
    reach = con.execute(f"SELECT max(Duration) FROM {source} WHERE TimestampNs >= {first} AND TimestampNs < {lo}"
                        ).fetchall()[0][0]
    first = max(first, lo - max(int(reach or 0), 0))
    return f"TimestampNs >= {first} AND TimestampNs < {hi} AND TimestampNs + Duration > {lo}"


def hour_requests_sql(con: duckdb.DuckDBPyConnection, snap: Snapshot, hour_ns: int) -> str:
    """SQL of the `requests` rows of one hour, read from the segments of `snap.inputs([hour_ns])`: what
    `build_hour` writes, and what a reader keeping its own copy of a stale hour computes."""
    source, where = _hour_source(snap, hour_ns)
    lo, hi = con.execute(f"SELECT min(TimestampNs), max(TimestampNs + Duration) FROM {source} "
                         f"WHERE IsRequest AND {where}").fetchall()[0]
    return M.requests_sql(source, request_where=where, span_where=_span_bound(con, source, hour_ns, lo, hi))


def _request_spans_sql(source: str, where: str, columns: str = "*",
                       shown: tuple[str, ...] = M.REQUEST_COLUMNS) -> str:
    """SQL of the model's request spans (its `req`: one row per request, a span stored twice counted once) of the
    spans in `source` meeting `where`, their `columns`; `shown`: the `requests` columns they give (M.chain_ctes)."""
    ctes = {name: sql for name, _, sql in M.chain_ctes(source, request_where=where, columns=shown)}
    return "WITH " + ", ".join(f"{n} AS ({ctes[n]})" for n in ("req0", "dup", "req")) + f" SELECT {columns} FROM req"


def request_keys_sql(snap: Snapshot, hour_ns: int) -> str:
    """SQL of (trace_id, span_id, start_ns) of the `requests` rows `exact_hour_sql` computes for one stale hour, from
    the model's request spans alone (no critical path: a reader needing only which requests an hour holds, such as
    their attribute values, can read them beside the sweep)."""
    return _request_spans_sql(*_hour_source(snap, hour_ns), "TraceId AS trace_id, SpanId AS span_id, rs AS start_ns",
                              ("trace_id", "span_id", "start_ns"))


def load_sweep() -> ctypes.CDLL | None:
    """The C critical-path sweep (`critical_path` in analysis/_replay.c), or None when the kernel is not built."""
    lib = load_kernel()
    return lib if lib is not None and hasattr(lib, "critical_path") else None


#: Bits of a stage's role in `info` (analysis/_replay.c): its end ends prefill, its start starts the stream,
#: its replica is the worker's.
_PREFILL, _STREAM, _WORKER = 1, 2, 4


def _ptr(a: np.ndarray, typ: type) -> Any:
    return a.ctypes.data_as(ctypes.POINTER(typ))


# pyarrow's own numpy conversions (to_numpy, pa.array of numpy) import pandas (0.3 CPU-s), which a dashboard opening
# a store with live hours would otherwise pay before its first page: the sweep moves its columns through buffers.

def _values(col: pa.ChunkedArray | pa.Array, dtype: type) -> np.ndarray:
    """The values of a fixed-width arrow column as a contiguous numpy array of `dtype` (of the same width)."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    width = np.dtype(dtype).itemsize
    if arr.type.bit_width != 8 * width:
        raise TypeError(f"{arr.type} is not {np.dtype(dtype)} wide")
    if not len(arr):
        return np.zeros(0, dtype)
    return np.frombuffer(arr.buffers()[1], dtype=dtype, count=len(arr), offset=arr.offset * width).copy()


def _valid(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """1 where the arrow column holds a value, 0 where it is null (uint8)."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if arr.null_count == 0:
        return np.ones(len(arr), np.uint8)
    bits = np.unpackbits(np.frombuffer(arr.buffers()[0], np.uint8), bitorder="little")
    return np.ascontiguousarray(bits[arr.offset:arr.offset + len(arr)])


def _arrow(values: np.ndarray, typ: pa.DataType, valid: np.ndarray | None = None) -> pa.Array:
    """A fixed-width arrow array of `values` (null where `valid` is false), its buffers taken from numpy."""
    values = np.ascontiguousarray(values)
    bitmap = None if valid is None else pa.py_buffer(np.packbits(valid.astype(bool), bitorder="little"))
    nulls = -1 if valid is not None else 0
    return pa.Array.from_buffers(typ, len(values), [bitmap, pa.py_buffer(values)], null_count=nulls)


def _span_ids(col: pa.ChunkedArray) -> tuple[pa.Array, np.ndarray]:
    """The span ids as one Arrow string array and its offsets as int64 (the kernel's): DuckDB's 32-bit offsets widened
    in numpy, not the whole column cast to large strings (a copy of every id: 0.2 CPU-s an hour of 1.4 M stage spans);
    a cast where they would not fit in one array of 32-bit offsets."""
    import pyarrow.compute as pc  # here: only an hour's build needs it, not every reader of the store (0.05 s)

    if not len(col):
        return pa.nulls(0, pa.large_string()), np.zeros(1, dtype=np.int64)
    try:
        ids = col.combine_chunks() if pa.types.is_string(col.type) else None
    except (pa.ArrowInvalid, pa.ArrowCapacityError):  # more than 2 GiB of ids
        ids = None
    if ids is None:
        ids = pc.cast(col, pa.large_string()).combine_chunks()
    width = 4 if pa.types.is_string(ids.type) else 8
    off = np.frombuffer(ids.buffers()[1], dtype=np.int32 if width == 4 else np.int64, count=len(ids) + 1,
                        offset=ids.offset * width)
    return ids, off.astype(np.int64)


def _swept_requests_sql(con: duckdb.DuckDBPyConnection, snap: Snapshot, hour_ns: int, lib: ctypes.CDLL,
                        names: dict[str, str]) -> str:
    """`hour_requests_sql`'s rows with the sweep (the model's `info` and `stage_ns`) computed by the C kernel.

    DuckDB computes the model's request spans (`req`) and stage spans (`st`) and the final SELECT, as the
    SQL does; the kernel replaces the relations between them. `names` are the temporary relations it
    creates in `con` (the caller drops them): the request spans, `info` and `stage_ns`.
    """
    source, where = _hour_source(snap, hour_ns)
    con.execute(f"CREATE OR REPLACE TEMP TABLE {names['req']} AS {_request_spans_sql(source, where)}")
    req = con.sql(f"SELECT rk, coalesce(rs, 0) AS rs, coalesce(re, 0) AS re, coalesce(hr, 0) AS hr, "
                  f"rs IS NOT NULL AND re IS NOT NULL AS ok FROM {names['req']}").fetchnumpy()
    # the stage spans' literal bound from the deduplicated request spans: the bound `st` itself applies
    lo, hi = con.execute(f"SELECT min(rs), max(re) FROM {names['req']}").fetchall()[0]
    st_sql = dict((name, sql) for name, _, sql in M.chain_ctes(
        source, request_where=where, span_where=_span_bound(con, source, hour_ns, lo, hi)))["st"]
    codes = " ".join(f"WHEN {M.quote(x)} THEN {c}" for c, x in enumerate(S.ALL_STAGES))
    st = con.sql(f"WITH req AS (SELECT * FROM {names['req']}) SELECT k, pk, s, e, "
                 f"CASE Stage {codes} ELSE {len(S.ALL_STAGES)} END::INTEGER AS code, Replica, SpanId "
                 f"FROM ({st_sql})").to_arrow_table()
    nr, ns, nstages = len(req["rk"]), st.num_rows, len(S.ALL_STAGES)
    rk = np.ascontiguousarray(req["rk"]).view(np.int64)
    rs, re, hr = (np.ascontiguousarray(req[c], dtype=np.int64) for c in ("rs", "re", "hr"))
    ok = np.ascontiguousarray(req["ok"], dtype=np.uint8)
    k, pk = (_values(st[c], np.int64) for c in ("k", "pk"))
    s, e = (_values(st[c], np.int64) for c in ("s", "e"))
    code = _values(st["code"], np.int32)
    rep_ok = _valid(st["Replica"])
    ids, id_off = _span_ids(st["SpanId"])
    id_ok = _valid(ids)
    data = ids.buffers()[2]
    id_dat = ctypes.c_void_p(data.address if data is not None and data.size else None)  # `ids` keeps it
    yielding = np.array([st_ in S.YIELDING_STAGES for st_ in S.ALL_STAGES] + [False], dtype=np.uint8)
    flags = np.array([(_PREFILL if x == S.PREFILL else 0) | (_STREAM if x == S.STREAMING else 0)
                      | (_WORKER if x in M.WORKER_STAGES else 0) for x in S.ALL_STAGES] + [0], dtype=np.uint8)
    stage_ns = np.zeros((nr, nstages + 1), dtype=np.int64)
    covered, prefill_end, stream_start, worker = (np.zeros(nr, dtype=np.int64) for _ in range(4))
    prefill_ok, stream_ok = np.zeros(nr, dtype=np.uint8), np.zeros(nr, dtype=np.uint8)
    i64, u8 = ctypes.c_int64, ctypes.c_uint8
    rc = lib.critical_path(nr, _ptr(rk, i64), _ptr(rs, i64), _ptr(re, i64), _ptr(hr, i64), _ptr(ok, u8),
                           ns, _ptr(k, i64), _ptr(pk, i64), _ptr(s, i64), _ptr(e, i64), _ptr(code, ctypes.c_int32),
                           _ptr(rep_ok, u8), _ptr(id_off, i64), id_dat, _ptr(id_ok, u8),
                           nstages, _ptr(yielding, u8), _ptr(flags, u8), _ptr(stage_ns, i64), _ptr(covered, i64),
                           _ptr(prefill_end, i64), _ptr(prefill_ok, u8), _ptr(stream_start, i64), _ptr(stream_ok, u8),
                           _ptr(worker, i64))
    if rc != 0:
        raise MemoryError("the critical-path kernel ran out of memory")
    keys = _arrow(rk.view(np.uint64), pa.uint64())
    a64 = pa.int64()
    con.register(names["stage_ns"], pa.table(
        {"rk": keys, **{f"{x}_ns": _arrow(stage_ns[:, c], a64) for c, x in enumerate(S.ALL_STAGES)},
         "covered_ns": _arrow(covered, a64)}))
    replica = st["Replica"].take(_arrow(np.where(worker < 0, 0, worker), a64, worker >= 0)) if ns else (
        pa.nulls(nr, pa.string()))
    con.register(names["info"], pa.table({
        "rk": keys, "prefill_end_ns": _arrow(prefill_end, a64, prefill_ok),
        "stream_start_ns": _arrow(stream_start, a64, stream_ok), "worker_replica": replica}))
    return (f"WITH req AS (SELECT * FROM {names['req']}), info AS (SELECT * FROM {names['info']}), "
            f"stage_ns AS (SELECT * FROM {names['stage_ns']})\n"
            + M.select_sql(M.DUCKDB, source, stages=True, columns=M.REQUEST_COLUMNS))


@contextlib.contextmanager
def exact_hour_sql(con: duckdb.DuckDBPyConnection, snap: Snapshot, hour_ns: int, kernel: bool = True
                   ) -> Iterator[str]:
    """SQL of the `requests` rows of one stale hour, valid inside the block: with `kernel` and the C kernel built,
    the critical-path sweep runs in C (`_swept_requests_sql`, the same rows, about half the CPU); otherwise all in
    the model's SQL (`hour_requests_sql`). The kernel's temporary relations on `con` are dropped after the block."""
    lib = load_sweep() if kernel else None
    if lib is None:
        yield hour_requests_sql(con, snap, hour_ns)
        return
    tag = uuid.uuid4().hex[:8]
    names = {n: f"_tailscope_build_{n}_{tag}" for n in ("req", "info", "stage_ns")}
    try:
        yield _swept_requests_sql(con, snap, hour_ns, lib, names)
    finally:
        con.execute(f"DROP TABLE IF EXISTS {names['req']}")
        for n in ("info", "stage_ns"):
            with contextlib.suppress(duckdb.Error):  # not registered when the sweep failed before
                con.unregister(names[n])


def build_hour(snap: Snapshot, hour_ns: int, con: duckdb.DuckDBPyConnection | None = None, *,
               threads: int | None = None, memory_limit: str = "4GB", kernel: bool = True) -> Path:
    """Compute and write the requests of one hour; return the file. Crash-safe (temp, fsync, rename).

    With `kernel` and the C kernel built, the critical-path sweep runs in C (`_swept_requests_sql`, the
    same rows); otherwise all in the model's SQL (`hour_requests_sql`).
    """
    own = con is None
    if con is None:
        con = duckdb.connect(":memory:")
        if threads:
            con.execute(f"SET threads = {int(threads)}")
        con.execute("SET memory_limit = ?", [memory_limit])
        spill_to_temp(con)
        con.execute("SET preserve_insertion_order = false")
        con.execute("SET enable_progress_bar = false")
    directory = partition_dir(snap.store, hour_ns)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"requests-{snap.key(hour_ns)}.parquet"
    tmp = directory / f".{final.name}.{uuid.uuid4().hex[:8]}.tmp"
    mine = snap.by_hour.get(hour_ns, [])  # the hour's own segments: its spans, for the recognition counts
    engines = dict(con.execute(engine_counts_sql(files_source([str(f) for f in mine]), snap.mapping)
                               ).fetchall()) if mine else {}
    meta = M.quote(json.dumps({str(k): int(v) for k, v in sorted(engines.items())}))
    try:
        with exact_hour_sql(con, snap, hour_ns, kernel) as sql:
            con.execute(f"COPY (SELECT * FROM ({sql}) ORDER BY start_ns, trace_id, span_id) TO '{tmp}' "
                        f"(FORMAT parquet, COMPRESSION zstd, COMPRESSION_LEVEL {ZSTD_LEVEL}, "
                        f"ROW_GROUP_SIZE {ROW_GROUP_ROWS}, KV_METADATA {{'{ENGINES_KEY}': {meta}}})")
        fsync_path(tmp)
        # the hour's attribute values (analysis.engine.attribute_values) before its requests: a reader seeing the
        # requests file sees them too
        AV.write_hour(con, _hour_source(snap, hour_ns)[0], hour_ns, tmp, AV.attributes_path(final))
        # and its GPU-time sweep (analysis.engine.gpu_sweep), likewise before the requests file
        _write_cost(con, snap, hour_ns, GS.cost_path(final))
        os.replace(tmp, final)
        fsync_path(directory)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        if own:
            con.close()
    _sweep(directory, keep=final)
    return final


def _write_cost(con: duckdb.DuckDBPyConnection, snap: Snapshot, hour_ns: int, final: Path) -> None:
    """Write an hour's cost file (gpu_sweep.write_hour) crash-safe: a temporary renamed into place."""
    tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        GS.write_hour(con, _hour_source(snap, hour_ns)[0], hour_ns, tmp)
        fsync_path(tmp)
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _sweep(directory: Path, keep: Path) -> None:
    """Remove superseded request files GRACE_S after they were superseded, and abandoned temporaries.

    A superseded file gets a marker (.<name>.superseded) the first time a sweep sees it: its
    grace runs from then, not from when it was written, so a reader that listed it just
    before (a dashboard open for hours) keeps it for GRACE_S.
    """
    cutoff = time.time() - GRACE_S
    for f in directory.iterdir():
        try:
            if f == keep:
                continue
            if f in (AV.attributes_path(keep), GS.cost_path(keep)):
                continue
            if (f.name.startswith(("requests-", GS.COST_PREFIX)) and f.suffix == ".parquet") or (
                    f.name.startswith(AV.ATTRIBUTES_PREFIX) and f.suffix in (".parquet", AV.ATTRIBUTES_SUFFIX)):
                marker = directory / f".{f.name}.superseded"
                if not marker.exists():
                    marker.touch()
                if marker.stat().st_mtime <= time.time() - GRACE_S:
                    f.unlink()
                    marker.unlink()
            elif f.name.endswith(".superseded"):
                if not (directory / f.name[1:].removesuffix(".superseded")).exists():
                    f.unlink()  # its file is gone
            elif f.name.startswith((".requests-", f".{AV.ATTRIBUTES_PREFIX}", f".{GS.COST_PREFIX}")) and (
                    f.stat().st_mtime < cutoff):
                f.unlink()  # a crashed writer's temporary
        except FileNotFoundError:
            pass


def materialize(store: Path | str, *, settled_before_ns: int | None = None, threads: int | None = None,
                memory_limit: str = "4GB", progress: Callable[[int, Path], None] | None = None) -> list[Path]:
    """Build the request file of every stale hour; return the files written.

    With `settled_before_ns`, only hours whose next hour ended by then (the segments an hour
    reads no longer change), as `tailscope collect` does while spans arrive (with one thread,
    so the receiver keeps the other cores).
    """
    store = require_store(Path(store))
    snap = snapshot(store)
    written = []
    for hour in snap.stale:
        if settled_before_ns is not None and hour + 2 * HOUR_NS > settled_before_ns:
            continue
        path = build_hour(snap, hour, threads=threads, memory_limit=memory_limit)
        written.append(path)
        if progress is not None:
            progress(hour, path)
    return written


def remove_hour(store: Path | str, hour_ns: int) -> None:
    """Delete the materialized requests of one hour (retention removed its spans: no reader uses them now)."""
    directory = partition_dir(Path(store), hour_ns)
    if directory.is_dir():
        shutil.rmtree(directory, ignore_errors=True)
        with contextlib.suppress(OSError):
            directory.parent.rmdir()  # the day, once its last hour is gone


def hour_bytes(store: Path | str, hour_ns: int) -> int:
    """Bytes of one hour's materialized request files (counted toward `--max-store-gb`)."""
    directory = partition_dir(Path(store), hour_ns)
    try:
        return sum(e.stat().st_size for e in os.scandir(directory) if e.is_file())
    except FileNotFoundError:
        return 0
