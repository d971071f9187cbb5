"""Open a store for querying: a DuckDB connection with the `spans`, `requests`, `stages` views.

A connection reads a snapshot: the segments (and materialized request hours) present when
it opened, or at the last `refresh(con, store)`. Writers in other processes keep adding
segments meanwhile and are never blocked (no DuckDB file, no lock); every scan inside one
query sees the same files, so a request never shows up with half its stages.

`requests` is the union of the fresh materialized hours (analysis.engine.materialize) and, for
every other hour, the request model computed on the fly from the spans (analysis.engine.model):
the same rows either way. `requests_between(lo_ns, hi_ns)` is the same over requests
starting in [lo_ns, hi_ns), reading only the files of those hours. With `sandbox=True` the
connection can only read the store (see analysis/engine/sandbox.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final, Literal, overload

import duckdb
import pyarrow as pa

from analysis.engine import gpu_sweep as GS
from analysis.engine import model as M
from analysis.engine.attribute_values import FILES_VIEW, LIVE_FILE_VIEW, files_view_sql, live_file_sql
from analysis.engine.materialize import (
    ENGINES_KEY,
    HOUR_NS,
    Snapshot,
    engine_counts_sql,
    hour_where,
    snapshot,
    stored_source,
)
from analysis.engine.sandbox import SandboxConnection
from analysis.engine.views import (
    LIVE_FACTS_BETWEEN,
    LIVE_HOUR_MACRO,
    LIVE_HOURS,
    LIVE_REQUESTS_KEPT,
    bound_once,
    files_source,
    spans_sql,
    spill_to_temp,
)
from tracing import schema as S
from tracing.store import require_store

#: Row ids of stored request rows carry their file's number above this bit (the row in the file below it).
ROW_ID_FILE_SHIFT = 40


def duck_type(typ: pa.DataType) -> str:
    """The DuckDB type DuckDB reads a Parquet column of this Arrow type as."""
    if pa.types.is_map(typ):
        return f"MAP({duck_type(typ.key_type)}, {duck_type(typ.item_type)})"
    if pa.types.is_list(typ):
        return f"{duck_type(typ.value_type)}[]"
    if pa.types.is_struct(typ):
        return "STRUCT(" + ", ".join(f'"{f.name}" {duck_type(f.type)}' for f in typ) + ")"
    if pa.types.is_timestamp(typ):
        return "TIMESTAMP WITH TIME ZONE" if typ.tz else "TIMESTAMP"
    if pa.types.is_boolean(typ):
        return "BOOLEAN"
    if pa.types.is_integer(typ):
        return "BIGINT"
    if pa.types.is_floating(typ):
        return "DOUBLE"
    return "VARCHAR"


def _empty_spans_ddl() -> str:
    """CREATE TABLE _empty_spans in SPAN_SCHEMA, from the schema alone (no Arrow scan: faster to start)."""
    cols = ", ".join(f'"{f.name}" {duck_type(f.type)}' for f in S.SPAN_SCHEMA)
    return f"CREATE TABLE _empty_spans ({cols})"


@overload
def connect(store: Path | str, *, sandbox: Literal[False] = False, threads: int | None = None,
            memory_limit: str | None = None) -> duckdb.DuckDBPyConnection: ...


@overload
def connect(store: Path | str, *, sandbox: Literal[True], threads: int | None = None,
            memory_limit: str | None = None) -> SandboxConnection: ...


def connect(store: Path | str, *, sandbox: bool = False, threads: int | None = None,
            memory_limit: str | None = None) -> duckdb.DuckDBPyConnection | SandboxConnection:
    """A new in-memory DuckDB connection with the store's views registered.

    Raises StoreError if `store` is not a store. The views see the segments present now;
    call `refresh(con, store)` (or reconnect) to see segments written later. With `sandbox`,
    an `analysis.engine.sandbox.SandboxConnection` instead: read-only, SELECT/EXPLAIN only, its own
    memory limit and threads (defaults SANDBOX_MEMORY_LIMIT, SANDBOX_THREADS); reconnect to refresh.
    """
    if sandbox:
        return SandboxConnection(store, threads=threads, memory_limit=memory_limit)
    store = require_store(Path(store)).resolve()
    con = duckdb.connect(":memory:")
    # the views bind the store's files at every query (a report binds them a dozen times): their Parquet footers
    # are read once, not per query. Files never change in place (segments are immutable, a materialized hour is
    # a new file), and DuckDB revalidates a cached footer against its file (duckdb/duckdb#17334).
    con.execute("SET parquet_metadata_cache = true")
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    if memory_limit:
        con.execute("SET memory_limit = ?", [memory_limit])
    spill_to_temp(con)
    con.execute(_empty_spans_ddl())
    refresh(con, store)
    return con


def request_engines(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Request spans by `tailscope.engine` in the connection's snapshot (the coverage line of `tailscope report`).

    Materialized hours carry their counts in the file's metadata, so only the other hours' spans are read.
    """
    counts: dict[str, int] = {}
    for (text,) in con.execute("SELECT counts FROM _engines_stored").fetchall():
        for engine, n in json.loads(text).items():
            counts[engine] = counts.get(engine, 0) + int(n)
    for engine, n in con.execute("SELECT engine, n FROM _engines_live").fetchall():
        counts[str(engine)] = counts.get(str(engine), 0) + int(n)
    return counts


def refresh(con: duckdb.DuckDBPyConnection, store: Path | str, snap: Snapshot | None = None) -> int:
    """Point the views at the segments and materialized hours present now (or in `snap`, a snapshot of
    `store` the caller took); return the segment count."""
    snap = snapshot(Path(store).resolve()) if snap is None else snap
    files = [str(f) for f in snap.segments]
    live = [str(f) for f in snap.inputs(snap.stale)]
    own = [str(f) for h in snap.stale for f in snap.by_hour.get(h, [])]
    # each file list is bound once here; the views below are created over empty tables of its shape
    # (views.bound_once), so a connect costs one bind of the files, not one per view that reads them
    sources = {"_spans_files": files_source(files) if files else "_empty_spans",
               "_spans_live_files": files_source(live) if live else "_empty_spans",
               "_spans_own_files": files_source(own) if own else "_empty_spans"}
    with bound_once(con, sources):
        _define_views(con, snap)
    return len(files)


#: The order of `keep_live_facts`' rows, and their ids (`rid`: 0, 1, ... in that order): the rows of a request table
#: with these columns numbered so (a reader's attribute file of the same requests, written beside: `write_live`).
LIVE_FACTS_ORDER: Final = "start_ns, trace_id, span_id"
LIVE_FACTS_RID: Final = f"row_number() OVER (ORDER BY {LIVE_FACTS_ORDER}) - 1 AS rid"


def keep_live_facts(con: duckdb.DuckDBPyConnection, rows: str, table: str) -> None:
    """Make `table` (a new table) of the stale hours' request facts and read them from it (`live_facts_from`).

    `rows` is a table of the model's `requests` rows of exactly the snapshot's stale hours that a reader keeps
    itself (the dashboard's workbench); the copy holds their fact columns in start order with each row's id
    (`rid`: 0, 1, ... in that order), once per snapshot instead of once per report (`percentiles.request_facts`
    reads it in place). The reader never changes `table` (a new snapshot gets a new table) and drops it once no
    report reads it. Call after `refresh` with the same snapshot."""
    names = [c[0] for c in con.execute("DESCRIBE _request_facts_live").fetchall() if c[0] != "rid"]
    cols = ", ".join('"' + n.replace('"', '""') + '"' for n in names)
    con.execute(f"CREATE TABLE {table} AS SELECT {cols}, {LIVE_FACTS_RID} FROM {rows} ORDER BY {LIVE_FACTS_ORDER}")
    live_facts_from(con, table)


def live_facts_from(con: duckdb.DuckDBPyConnection, table: str, temporary: bool = False) -> None:
    """Read the stale hours' request facts (what `percentiles.request_facts` otherwise copies once per connection
    snapshot) from `table` (`keep_live_facts`'s: the facts with their ids, `rid`), in place. `temporary`: on this
    cursor only, so a report binds the table it started with while a refresh points the connection at the next
    one."""
    con.execute(f"CREATE OR REPLACE {'TEMP ' if temporary else ''}VIEW _request_facts_live AS SELECT * FROM {table}")


def live_requests_from(con: duckdb.DuckDBPyConnection, table: str | None) -> None:
    """Read the stale hours' exact `requests` rows (stage columns included) from `table`, which a reader keeps
    itself with exactly the model's rows of the snapshot's stale hours (the dashboard's workbench, once every
    critical path is computed), where only a few requests' rows are wanted (explain.stage_rows), instead of
    recomputing them from the hours' spans; None: from the spans again (the rows are not all exact)."""
    if table is None:
        con.execute(f"DROP VIEW IF EXISTS {LIVE_REQUESTS_KEPT}")
    else:
        con.execute(f"CREATE OR REPLACE VIEW {LIVE_REQUESTS_KEPT} AS SELECT {', '.join(M.REQUEST_COLUMNS)} "
                    f"FROM {table}")


#: The empty table of the `requests` columns the stored-row views read when no hour is materialized. A view over
#: `_requests_live ... WHERE false` would bind the whole request model again in every statement that reads the
#: facts or the stored rows (about 9 ms each, a dozen times a report) to return no row.
NO_STORED_ROWS = "_requests_none_stored"


def _no_stored_rows(con: duckdb.DuckDBPyConnection) -> None:
    """Make NO_STORED_ROWS: the columns of `requests` with the types the catalog holds for `_requests_live`'s
    (read from it, so the model is not bound once more), no row."""
    from analysis.engine.percentiles import quote_ident  # here: percentiles loads polars; opening a store does not

    types = dict(con.execute("SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = '_requests_live' "
                             "AND database_name = current_database() AND schema_name = current_schema()").fetchall())
    listed = ", ".join(f"{quote_ident(c)} {types[c]}" for c in M.REQUEST_COLUMNS)
    con.execute(f"CREATE OR REPLACE TABLE {NO_STORED_ROWS} ({listed})")


def _define_views(con: duckdb.DuckDBPyConnection, snap: Snapshot) -> None:
    """The views of a connection over the relations `_spans_files`, `_spans_live_files`, `_spans_own_files`."""
    cols = ", ".join(M.REQUEST_COLUMNS)
    mapping = snap.mapping
    con.execute(f"CREATE OR REPLACE VIEW spans AS {spans_sql('_spans_files', mapping)}")
    con.execute(f"CREATE OR REPLACE VIEW _spans_live AS {spans_sql('_spans_live_files', mapping)}")
    where = hour_where(snap.stale)
    # true for a request span of an hour computed on the fly (explain.stage_rows reads the rest from the files)
    con.execute(f"CREATE OR REPLACE MACRO {LIVE_HOUR_MACRO}(TimestampNs) AS {where}")
    con.execute(f"CREATE OR REPLACE VIEW _requests_live AS {M.requests_sql('_spans_live', request_where=where)}")
    con.execute(f"CREATE OR REPLACE VIEW _request_facts_live AS {M.facts_sql('_spans_live', request_where=where)}")
    stored = [str(f) for f in snap.fresh.values()]
    # the same rows, each with a row id (file number << ROW_ID_FILE_SHIFT | row in file): the request facts
    # address rows by it (percentiles.request_facts) without copying the files into a table
    rows = " UNION ALL ".join(
        f"SELECT {cols}, ({i}::BIGINT << {ROW_ID_FILE_SHIFT}) | file_row_number AS rid "
        f"FROM read_parquet({M.quote(f)}, file_row_number = true, hive_partitioning = false)"
        for i, f in enumerate(stored, 1))
    if not stored:
        _no_stored_rows(con)
    con.execute(f"CREATE OR REPLACE VIEW _request_rows_stored AS "
                f"{rows or f'SELECT {cols}, 0::BIGINT AS rid FROM {NO_STORED_ROWS}'}")
    # the fresh hours' stored GPU-time sweeps (analysis.cost sums them instead of sweeping those hours again)
    costs = [(h, GS.cost_path(f)) for h, f in sorted(snap.fresh.items())]
    listed = ", ".join(f"({h}::BIGINT, {M.quote(str(p))})" for h, p in costs if p.is_file())
    con.execute(f"CREATE OR REPLACE VIEW {GS.COST_FILES_VIEW} AS " + (
        f"SELECT * FROM (VALUES {listed}) t(hour_ns, path)" if listed
        else "SELECT NULL::BIGINT AS hour_ns, NULL::VARCHAR AS path WHERE false"))
    # the files' numbers (their rows' ids above): the attribute values written with an hour are found by them
    con.execute(f"CREATE OR REPLACE VIEW {FILES_VIEW} AS {files_view_sql(stored)}")
    con.execute(f"CREATE OR REPLACE VIEW {LIVE_FILE_VIEW} AS {live_file_sql(None)}")  # a reader's: write_live
    if stored:
        con.execute(f"CREATE OR REPLACE VIEW _requests_stored AS SELECT {cols} FROM {stored_source(stored)}")
        con.execute(f"CREATE OR REPLACE VIEW requests AS SELECT {cols} FROM _requests_stored "
                    f"UNION ALL SELECT {cols} FROM _requests_live")
    else:
        con.execute(f"CREATE OR REPLACE VIEW _requests_stored AS SELECT {cols} FROM {NO_STORED_ROWS}")
        con.execute("CREATE OR REPLACE VIEW requests AS SELECT * FROM _requests_live")
    # request spans by engine: from the files' metadata where fresh, else counted in the hour's own segments
    live_engines = engine_counts_sql("_spans_own_files", mapping)
    con.execute(f"CREATE OR REPLACE VIEW _engines_live AS {live_engines}")
    kv = (f"SELECT decode(value) AS counts FROM parquet_kv_metadata([{', '.join(M.quote(f) for f in stored)}]) "
          f"WHERE decode(key) = {M.quote(ENGINES_KEY)}") if stored else "SELECT NULL::VARCHAR AS counts WHERE false"
    con.execute(f"CREATE OR REPLACE VIEW _engines_stored AS {kv}")
    # the same over [lo, hi): the live part reads only the spans a request of that range may read
    narrow = (f"(SELECT * FROM _spans_live WHERE TimestampNs >= (lo // {HOUR_NS}) * {HOUR_NS} - {HOUR_NS} "
              f"AND TimestampNs < (hi // {HOUR_NS}) * {HOUR_NS} + 2 * {HOUR_NS})")
    live_between = M.requests_sql(narrow, request_where=f"{where} AND TimestampNs >= lo AND TimestampNs < hi")
    con.execute(f"CREATE OR REPLACE MACRO requests_between(lo, hi) AS TABLE "
                f"SELECT {cols} FROM _requests_stored WHERE start_ns >= lo AND start_ns < hi "
                f"UNION ALL SELECT {cols} FROM ({live_between})")
    # the facts likewise, for percentiles.request_facts to compute an hour at a time, and within an hour the traces
    # whose id hashes to `part` modulo `parts`: computed over every stale hour at once, the model's relations of
    # 10 M spans passed 3 GiB, and one hour of 5 M spans held 1.1 GiB. Each part's are the same rows: a request reads
    # only the spans of its own trace in its hour and the next and previous ones, and a request span stored twice
    # is one trace's, so it is found twice within one part.
    part = "hash(TraceId) % parts = part"
    in_part = f"{where} AND TimestampNs >= lo AND TimestampNs < hi AND {part}"
    con.execute(f"CREATE OR REPLACE MACRO {LIVE_FACTS_BETWEEN}(lo, hi, part, parts) AS TABLE "
                f"{M.facts_sql(narrow, request_where=in_part, span_where=part)}")
    listed = ", ".join(f"({h}::BIGINT)" for h in sorted(snap.stale))
    con.execute(f"CREATE OR REPLACE VIEW {LIVE_HOURS} AS " + (
        f"SELECT * FROM (VALUES {listed}) t(hour_ns)" if listed else "SELECT NULL::BIGINT AS hour_ns WHERE false"))
    con.execute(f"CREATE OR REPLACE VIEW stages AS {M.stages_sql('requests')}")
