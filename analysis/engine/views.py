"""The documented SQL views over a segment store: `spans`, `requests`, `stages`.

The request model (what a request is, its critical-path stage columns, TTFT / TPOT,
status, replica) is defined once in analysis.engine.model; this module names the views built
from it. `VIEW_SQL` computes `requests` / `stages` from whatever relation is called
`spans` in the connection (used by per-trace helpers and the dashboard); a connection
from analysis.engine.connect reads materialized hours instead where they are fresh
(analysis.engine.materialize).
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import duckdb

from analysis.engine import model as M
from analysis.mapping.rules import Mapping, project

REQUEST_STAGE_COLUMNS: tuple[str, ...] = M.STAGE_COLUMNS
#: Threads reading segment footers (their columns) when a snapshot lists many segments.
FOOTER_THREADS = 4


def _quote(text: str) -> str:
    return M.quote(text)


def spill_to_temp(con: duckdb.DuckDBPyConnection) -> None:
    """Make an in-memory connection spill (past its memory_limit) into a directory of its own under the system's
    temporary directory, not DuckDB's default `.tmp/` in the working directory; DuckDB creates it at its first spill
    and removes it when the connection closes."""
    path = os.path.join(tempfile.gettempdir(), f"tailscope-duckdb-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    con.execute("SET temp_directory = ?", [path]).fetchall()


def spans_sql(source: str, mapping: Mapping | None = None) -> str:
    """SQL of the `spans` view over `source` (a FROM item: read_parquet(...) or a table), with the store's
    `mapping` (analysis.mapping) applied when it has one."""
    return f"SELECT *, TimestampNs + Duration AS EndNs FROM {project(source, mapping)}"


def with_later_columns(scan: str) -> str:
    """A FROM item over `scan` (a read_parquet call) that has every LATER_COLUMNS column even when no file does.

    union_by_name gives NULL where some files lack a column, but no column at all when every file
    does; the typed empty relation supplies it. NULL means "written before the column": readers
    coalesce it to the default (analysis.engine.model.LATER_COLUMNS).
    """
    empty = ", ".join(f"NULL::{typ} AS {name}" for name, typ, _ in M.LATER_COLUMNS)
    return f"(SELECT * FROM {scan} UNION ALL BY NAME SELECT {empty} WHERE false)"


def files_source(files: list[str]) -> str:
    """A FROM item over a fixed list of segment files (one snapshot), older segments included.

    Files are grouped by their columns (`schema_groups`); each group is one `read_parquet` without
    union_by_name, whose binding opens only its first file (union_by_name opens every file at every
    bind: seconds per bind on thousands of small segments), and groups are unioned by name.
    """
    groups = schema_groups(files)
    scans = [f"read_parquet([{', '.join(_quote(f) for f in group)}], hive_partitioning = false)" for group in groups]
    if len(scans) == 1:
        return with_later_columns(scans[0])
    return with_later_columns("(" + " UNION ALL BY NAME ".join(f"SELECT * FROM {s}" for s in scans) + ")")


def schema_groups(files: list[str]) -> list[list[str]]:
    """`files` grouped by their columns (name and Arrow type, any order), in order of first appearance.

    A file whose footer cannot be read (gone, corrupt) is a group of its own: DuckDB then says what is wrong
    with it when the query reads it, as it would have without grouping.
    """
    if len(files) < 2:
        return [list(files)] if files else []
    keys = _schema_keys(files)
    groups: dict[object, list[str]] = {}
    for i, (f, key) in enumerate(zip(files, keys, strict=True)):
        groups.setdefault(key if key is not None else ("unreadable", i), []).append(f)
    return list(groups.values())


def _schema_keys(files: list[str]) -> list[tuple[tuple[str, str], ...] | None]:
    """Each file's columns (`_schema_key`), footers read in a few threads when there are many."""
    if len(files) < 64:
        return [_schema_key(f) for f in files]
    with ThreadPoolExecutor(FOOTER_THREADS) as pool:
        return list(pool.map(_schema_key, files, chunksize=64))


def _schema_key(path: str) -> tuple[tuple[str, str], ...] | None:
    """The sorted (name, Arrow type) columns of a Parquet file, or None when its footer cannot be read."""
    try:
        st = os.stat(path)
        return _schema_key_of(path, st.st_size, st.st_mtime_ns)
    except (OSError, ValueError):  # gone or unreadable (pyarrow's errors are ValueError or OSError subclasses)
        return None


@functools.lru_cache(maxsize=200_000)
def _schema_key_of(path: str, _size: int, _mtime_ns: int) -> tuple[tuple[str, str], ...]:
    """_schema_key cached by path, size and mtime (segments are immutable): a long-lived reader reads a footer once."""
    import pyarrow.parquet as pq

    key = tuple(sorted((f.name, str(f.type)) for f in pq.read_schema(path)))
    return _SCHEMA_KEYS.setdefault(key, key)  # one object per distinct schema, however many files have it


#: The distinct schemas seen (a store has a handful), shared by every cached file that has one.
_SCHEMA_KEYS: dict[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]] = {}


@contextlib.contextmanager
def bound_once(con: duckdb.DuckDBPyConnection, sources: dict[str, str]) -> Iterator[None]:
    """Create each view `name` over an empty table of the shape of `sources[name]` (one bind each), let the
    caller define the views that read them (DuckDB binds a view when it is created: over the file list, a
    dozen binds per connect), then point each view at its source. Queries bind the files as before."""
    shapes = {name: f"_tailscope_shape_{name}" for name in sources}
    for name, source in sources.items():
        con.execute(f"CREATE OR REPLACE TEMP TABLE {shapes[name]} AS SELECT * FROM {source} LIMIT 0")
        con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM {shapes[name]}")
    try:
        yield
        for name, source in sources.items():
            con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM {source}")
    finally:
        for shape in shapes.values():
            con.execute(f"DROP TABLE IF EXISTS {shape}")


#: `requests` and `stages` computed from the relation named `spans` (no materialized hours).
VIEW_SQL: dict[str, str] = {
    "requests": M.requests_sql("spans"),
    "stages": M.stages_sql("requests"),
}

#: Macro of a connection from analysis.engine.connect: is a span start (ns) in an hour that is not materialized?
LIVE_HOUR_MACRO = "_tailscope_live_hour"
#: Table macro of a connection from analysis.engine.connect: the request facts (analysis.engine.model.facts_sql) of the
#: requests not materialized that start in [lo, hi) and whose trace id hashes to `part` modulo `parts`, read from the
#: spans their hours read only.
LIVE_FACTS_BETWEEN = "_request_facts_live_between"
#: View of a connection from analysis.engine.connect: the start (ns) of each hour not materialized (hour_ns).
LIVE_HOURS = "_live_hours"
#: A view a reader keeping the stale hours' exact `requests` rows defines over them (connect.live_requests_from):
#: where it exists, explain.stage_rows reads those hours' stage columns from it instead of their spans.
LIVE_REQUESTS_KEPT = "_requests_live_kept"

#: The documented views, for docs and tests.
PUBLIC_VIEWS: tuple[str, ...] = ("spans", "requests", "stages")
