"""A query connection that can only read the store: for SQL typed by whoever uses the dashboard.

Three layers, each enough for most statements and together for all:
1. DuckDB itself: the views live in a database file opened read-only (CREATE, DROP, ALTER,
   INSERT, ATTACH ':memory:' fail), external access is off and the only allowed paths are the
   store's segment files, one by one (no directory: no new file can be written or read, no temp
   directory, no extension directory), known extensions are never installed or loaded, and the
   configuration is locked (SET, RESET, PRAGMA fail). Its own memory limit and thread count.
2. The statement gate: every statement is parsed by DuckDB and only SELECT and EXPLAIN run. It
   closes the two holes DuckDB leaves: `COPY ... TO '<segment file>' (USE_TMP_FILE false)`
   would overwrite an allowed segment in place, and TEMP objects (connection-local) can be made.
3. Only the methods below exist: no `sql`, `query`, `register`, `load_extension` ...

A sandbox reads the segments present when it was opened; open a new one to see later ones.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import duckdb

from analysis.engine.views import VIEW_SQL, bound_once, files_source, spans_sql
from analysis.mapping.rules import Mapping
from analysis.mapping.rules import load as load_mapping
from tracing import schema as S
from tracing.errors import QueryError
from tracing.store import require_store, segment_files

#: Memory DuckDB may use for one sandbox (all its cursors together); queries past it fail.
SANDBOX_MEMORY_LIMIT = "2GB"
#: Threads of one sandbox's queries.
SANDBOX_THREADS = 2
#: Statement types the gate lets through.
ALLOWED = (duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN)


class RefusedStatement(QueryError, duckdb.PermissionException):
    """A statement other than SELECT or EXPLAIN was sent to a sandbox."""

    def __init__(self, what: str, sql: str = "") -> None:
        QueryError.__init__(self, sql, what)


def _build(db: Path, files: list[str], mapping: Mapping | None) -> None:
    con = duckdb.connect(str(db))
    try:
        if not files:  # the views still need the columns
            con.register("_empty_spans_arrow", S.empty_span_table())
            con.execute("CREATE TABLE _empty_spans AS SELECT * FROM _empty_spans_arrow")
            con.unregister("_empty_spans_arrow")
        # the files are bound once (views.bound_once), not once per view that reads them
        with bound_once(con, {"_spans_files": files_source(files) if files else "_empty_spans"}):
            con.execute(f"CREATE VIEW spans AS {spans_sql('_spans_files', mapping)}")
            for name, sql in VIEW_SQL.items():
                con.execute(f"CREATE VIEW {name} AS {sql}")
        con.execute("CHECKPOINT")
    finally:
        con.close()


class SandboxCursor:
    """One cursor of a sandbox: execute (gated), fetch, interrupt, close."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self._con = con

    def execute(self, sql: str, parameters: Any = None) -> SandboxCursor:
        """Run `sql` when every statement in it is a SELECT or EXPLAIN; RefusedStatement otherwise."""
        for statement in self._con.extract_statements(sql):
            if statement.type not in ALLOWED:
                raise RefusedStatement(f"the sandbox runs SELECT and EXPLAIN only, not {statement.type.name}")
        self._con.execute(sql, parameters)
        return self

    @property
    def description(self) -> Any:
        """Column names and types of the last result (DB-API)."""
        return self._con.description

    def fetchall(self) -> list[Any]:
        """All rows of the last result."""
        return self._con.fetchall()

    def fetchone(self) -> Any:
        """The next row of the last result."""
        return self._con.fetchone()

    def fetchmany(self, size: int = 1) -> list[Any]:
        """The next `size` rows of the last result."""
        return self._con.fetchmany(size)

    def interrupt(self) -> None:
        """Stop the running query (from another thread)."""
        self._con.interrupt()

    def close(self) -> None:
        """Close the cursor."""
        self._con.close()


class SandboxConnection(SandboxCursor):
    """A read-only connection to a store's views; `cursor()` gives one per concurrent query."""

    def __init__(self, store: Path | str, *, threads: int | None = None, memory_limit: str | None = None) -> None:
        root = require_store(Path(store)).resolve()
        files = [str(f) for f in segment_files(root)]
        tmp = Path(tempfile.mkdtemp(prefix="tailscope-sandbox-"))
        try:
            db = tmp / "views.duckdb"
            _build(db, files, load_mapping(root))
            con = duckdb.connect(str(db), read_only=True, config={
                "threads": int(threads or SANDBOX_THREADS),
                "memory_limit": memory_limit or SANDBOX_MEMORY_LIMIT,
                "autoinstall_known_extensions": False,
                "autoload_known_extensions": False,
            })
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # the open database keeps its (now unlinked) file
        con.execute("SET temp_directory = ''")
        con.execute("SET allowed_directories = []")
        con.execute("SET allowed_paths = ?", [files])
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
        super().__init__(con)
        self.store = root
        self.segments = len(files)

    def cursor(self) -> SandboxCursor:
        """A new cursor on the same database (its own result; queries may run concurrently)."""
        return SandboxCursor(self._con.cursor())
