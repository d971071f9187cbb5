"""Open a store for querying: a DuckDB connection with the `spans`, `requests`, `stages` views.

A connection reads a snapshot: the segments committed when it opened (or at the last
`refresh(con, store)`). Writers in other processes keep adding segments meanwhile and are
never blocked (no DuckDB file, no lock); every scan inside one query sees the same files,
so a request never shows up with half its stages. With
`sandbox=True` the connection can only read the store (see analysis/sandbox.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, overload

import duckdb
import pyarrow as pa

from analysis.sandbox import SandboxConnection
from analysis.views import VIEW_SQL, files_source, spans_sql
from tracing import schema as S
from tracing.store import require_store, segment_files


def _empty_spans() -> pa.Table:
    return S.SPAN_SCHEMA.empty_table()


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
    an `analysis.sandbox.SandboxConnection` instead: read-only, SELECT/EXPLAIN only, its own
    memory limit and threads (defaults SANDBOX_MEMORY_LIMIT, SANDBOX_THREADS); reconnect to refresh.
    """
    if sandbox:
        return SandboxConnection(store, threads=threads, memory_limit=memory_limit)
    store = require_store(Path(store)).resolve()
    con = duckdb.connect(":memory:")
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    if memory_limit:
        con.execute("SET memory_limit = ?", [memory_limit])
    con.register("_empty_spans_arrow", _empty_spans())
    con.execute("CREATE TABLE _empty_spans AS SELECT * FROM _empty_spans_arrow")
    con.unregister("_empty_spans_arrow")
    refresh(con, store)
    for name, sql in VIEW_SQL.items():
        con.execute(f"CREATE VIEW {name} AS {sql}")
    return con


def refresh(con: duckdb.DuckDBPyConnection, store: Path | str) -> int:
    """Point the `spans` view (and all views on it) at the segments committed now; return their count."""
    files = [str(f) for f in segment_files(Path(store).resolve())]
    source = files_source(files) if files else "_empty_spans"
    con.execute(f"CREATE OR REPLACE VIEW spans AS {spans_sql(source)}")
    return len(files)
