"""Open a store for querying: a DuckDB connection with the `spans`, `requests`, `stages` views.

The views read the segment files at query time, so a reader sees segments committed by
other processes while it runs and never blocks them (no DuckDB file, no lock). With
`sandbox=True` the connection can read only the store: external access is off, the
store is the only allowed directory, and the configuration is locked.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa

from analysis.views import VIEW_SQL, parquet_source, spans_sql
from tracing import schema as S
from tracing.store import require_store, segment_files


def _empty_spans() -> pa.Table:
    return S.SPAN_SCHEMA.empty_table()


def connect(store: Path | str, *, sandbox: bool = False, threads: int | None = None,
            memory_limit: str | None = None) -> duckdb.DuckDBPyConnection:
    """A new in-memory DuckDB connection with the store's views registered.

    Raises StoreError if `store` is not a store. An empty store gives empty views; reconnect
    to see segments written after that (a non-empty store's views always see new segments).
    """
    store = require_store(Path(store)).resolve()
    con = duckdb.connect(":memory:")
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    if memory_limit:
        con.execute("SET memory_limit = ?", [memory_limit])
    if segment_files(store):
        source = parquet_source(str(store / S.SEGMENT_GLOB))
    else:
        con.register("_empty_spans_arrow", _empty_spans())
        con.execute("CREATE TABLE _empty_spans AS SELECT * FROM _empty_spans_arrow")
        con.unregister("_empty_spans_arrow")
        source = "_empty_spans"
    con.execute(f"CREATE VIEW spans AS {spans_sql(source)}")
    for name, sql in VIEW_SQL.items():
        con.execute(f"CREATE VIEW {name} AS {sql}")
    if sandbox:
        con.execute("SET allowed_directories = ?", [[str(store) + "/"]])
        con.execute("SET enable_external_access = false")
        con.execute("SET autoinstall_known_extensions = false")
        con.execute("SET autoload_known_extensions = false")
        con.execute("SET lock_configuration = true")
    return con
