"""The CLI's one seam to an engine: `open_backend` turns the engine options into a `Backend` the commands call.

`report`, `sql` and `dashboard` never ask which engine runs: they call a Backend's methods and ask
`can("dimensions")` where an option needs a capability, printing `missing(...)` (one line) when it is not
there. Two implementations satisfy the protocol: `DuckDBBackend` (a store on disk) and `ClickHouseBackend`
(an otel_traces table behind --dsn). Every figure comes from analysis either way; a backend only opens the
engine, calls the analysis function of its engine and closes what it opened. analysis is imported when a
method runs, so `tailscope --help` stays fast.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

from tailscope.commands.common import (
    Engine,
    clickhouse_client,
    errors_as_messages,
    fail,
    query_failure,
    read_mapping,
    store_path,
    write_through,
)

if TYPE_CHECKING:
    import duckdb

    from analysis.contract import Report
    from intake.recognition import Recognition

#: What a backend may or may not do, by name: what each means.
CAPABILITIES: Final[dict[str, str]] = {
    "dimensions": "--dimensions / --exclude-dimensions: attribute dimensions chosen by pattern",
    "mapping_file": "--mapping: a mapping file applied to the spans read (a store keeps its own instead)",
}

#: A query naming one of these reads the request model, so `sql` on a store materializes settled hours first.
READS_REQUESTS = re.compile(r"\b(requests|stages|requests_between)\b", re.IGNORECASE)


@dataclass(frozen=True)
class ReportAsk:
    """What `tailscope report` asks of an engine (its options, as analysis takes them)."""

    metric: str = "e2e"
    window: str | None = None
    since: str | None = None
    until: str | None = None
    include_failures: bool = True
    sampling_policy: str = "auto"
    dimensions: str | None = None
    exclude_dimensions: str | None = None
    materialize: bool = True


@dataclass(frozen=True)
class Served:
    """What the dashboard reads on an engine: a phrase naming it, the environment telling the app, the app's
    arguments."""

    what: str
    env: dict[str, str]
    args: list[str]


@runtime_checkable
class Backend(Protocol):
    """An engine the commands run on: the report, one SQL query, the dashboard's target, and its capabilities."""

    #: what the coverage line's advice names as the store (a directory, or DIR where there is none)
    where: str

    def can(self, capability: str) -> bool:
        """Whether this engine does `capability` (a key of CAPABILITIES)."""

    def missing(self, capability: str) -> str:
        """Why this engine cannot do `capability` (one line; empty when it can)."""

    def use_mapping(self, path: Path) -> None:
        """Apply a mapping file to the spans read from now on (where `can("mapping_file")`)."""

    def report(self, ask: ReportAsk) -> tuple[Report, Recognition]:
        """The `report --json` contract and what the data lets the report recognise (the coverage line)."""

    def sql(self, query: str, materialize: bool) -> tuple[list[str], list[tuple[Any, ...]]]:
        """(column names, rows) of one query over the views."""

    def served(self) -> Served:
        """What `tailscope dashboard` serves, checked before the app starts."""


class DuckDBBackend:
    """A store on disk, read by DuckDB (analysis.engine.connect)."""

    def __init__(self, store: Path | None) -> None:
        """`store`: the --store directory (None: the default store)."""
        self.path = store_path(store)
        self.where = str(self.path)

    def can(self, capability: str) -> bool:
        """Whether a store does `capability`."""
        return capability in CAPABILITIES and capability != "mapping_file"

    def missing(self, capability: str) -> str:
        """Why a store cannot do `capability`."""
        if capability == "mapping_file":
            return "--mapping is for --engine clickhouse: a store keeps its mapping (tailscope map --store DIR ...)"
        return "" if self.can(capability) else f"a store cannot do {capability}"

    def use_mapping(self, path: Path) -> None:
        """A store keeps its own mapping: a one-line error."""
        fail(self.missing("mapping_file"))

    @contextmanager
    def _connection(self, what: str) -> Iterator[duckdb.DuckDBPyConnection]:
        import duckdb

        from analysis.engine.connect import connect

        with errors_as_messages():
            con = connect(self.path)
        try:
            yield con
        except duckdb.Error as exc:
            fail(query_failure(what, exc))
        finally:
            con.close()

    def report(self, ask: ReportAsk) -> tuple[Report, Recognition]:
        """The report of the store, its coverage counted beside it on a second cursor."""
        from concurrent.futures import ThreadPoolExecutor

        from analysis.report import build_report

        if ask.materialize:
            with errors_as_messages():
                write_through(self.path)
        with errors_as_messages(), self._connection("report") as con:
            con.execute("SET enable_progress_bar = false").fetchall()
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tailscope-coverage") as pool:
                # the coverage line's count of every span is a scan of its own: on a second connection to the
                # same views, it runs beside the report (DuckDB releases the GIL) instead of after it
                coverage = pool.submit(_recognition_on, con.cursor())
                result = build_report(con, metric=ask.metric, window_s=ask.window, since=ask.since,
                                      until=ask.until, include_failures=ask.include_failures,
                                      sampling_policy=ask.sampling_policy, dimensions=ask.dimensions,
                                      exclude_dimensions=ask.exclude_dimensions)
                return result, coverage.result()

    def sql(self, query: str, materialize: bool) -> tuple[list[str], list[tuple[Any, ...]]]:
        """The query on the store's views (settled hours materialized first when it reads the request model)."""
        if materialize and READS_REQUESTS.search(query):
            with errors_as_messages():
                write_through(self.path)
        with self._connection("query") as con:
            cursor = con.execute(query)
            return [d[0] for d in cursor.description or []], cursor.fetchall()

    def served(self) -> Served:
        """The store's directory, which must exist."""
        from tracing.store import ENV_STORE, require_store

        with errors_as_messages():
            path = require_store(self.path).resolve()
        return Served(f"store {path}", {ENV_STORE: str(path)}, ["--store", str(path)])


class ClickHouseBackend:
    """An otel_traces table on ClickHouse (analysis.clickhouse), reached through --dsn."""

    #: the capabilities a table lacks (today), each with the line that says so
    NOT_YET: Final[dict[str, str]] = {
        "dimensions": "--dimensions and --exclude-dimensions need --engine duckdb: the ClickHouse engine explains "
                      "by the built-in dimensions only",
    }
    where = "DIR"

    def __init__(self, dsn: str | None, table: str) -> None:
        """`dsn`: --dsn (required: a one-line error without it); `table`: --table."""
        if not dsn:
            fail("--engine clickhouse needs --dsn (chdb:PATH or clickhouse://user@host:8123/db)")
        self.dsn, self.table = dsn, table

    def can(self, capability: str) -> bool:
        """Whether a ClickHouse table does `capability`."""
        return capability in CAPABILITIES and capability not in self.NOT_YET

    def missing(self, capability: str) -> str:
        """Why a ClickHouse table cannot do `capability`."""
        return self.NOT_YET.get(capability, "" if self.can(capability) else f"a table cannot do {capability}")

    def use_mapping(self, path: Path) -> None:
        """Compile the mapping file's rules over the table's spans for this process."""
        from analysis.clickhouse.promotion import use_mapping

        with errors_as_messages():
            use_mapping(self.table, read_mapping(path))

    def report(self, ask: ReportAsk) -> tuple[Report, Recognition]:
        """The report computed on the server (analysis.clickhouse.report), and the table's coverage."""
        with errors_as_messages():
            from analysis.clickhouse import recognition_counts
            from analysis.clickhouse.report import build_report
            from intake.recognition import Recognition

            client = clickhouse_client(self.dsn, self.table)
            try:
                result = build_report(client, self.table, metric=ask.metric, window_s=ask.window, since=ask.since,
                                      until=ask.until, include_failures=ask.include_failures,
                                      sampling_policy=ask.sampling_policy, materialized=ask.materialize)
                return result, Recognition(*recognition_counts(client, self.table))
            finally:
                client.close()

    def sql(self, query: str, materialize: bool) -> tuple[list[str], list[tuple[Any, ...]]]:
        """The query on the same views computed from the table, read-only on the server."""
        with errors_as_messages():
            from analysis.clickhouse import query_views

            client = clickhouse_client(self.dsn, self.table)
            try:
                result = query_views(client, query, self.table, materialized=materialize)
            finally:
                client.close()
        return list(result.column_names), [tuple(r.values()) for r in result.to_pylist()]

    def served(self) -> Served:
        """The table (its name checked, the DSN parsed here; the app reaches it through the environment)."""
        from analysis.clickhouse import check_table_name, parse_dsn
        from dashboard.settings import ENV_DSN, ENV_ENGINE, ENV_TABLE

        with errors_as_messages():
            where = parse_dsn(self.dsn)
            check_table_name(self.table)
        return Served(f"ClickHouse table {self.table} at {where}",
                      {ENV_ENGINE: "clickhouse", ENV_DSN: self.dsn, ENV_TABLE: self.table},
                      ["--engine", "clickhouse", "--table", self.table])


def open_backend(engine: Engine, store: Path | None = None, dsn: str | None = None, table: str = "otel_traces",
                 mapping: Path | None = None) -> Backend:
    """The engine the options name: the one place the CLI chooses it. A --mapping file the engine cannot take
    is a one-line error; one it takes applies from here on."""
    backend: Backend = ClickHouseBackend(dsn, table) if engine is Engine.clickhouse else DuckDBBackend(store)
    if mapping is not None:
        if not backend.can("mapping_file"):
            fail(backend.missing("mapping_file"))
        backend.use_mapping(mapping)
    return backend


def _recognition_on(cur: duckdb.DuckDBPyConnection) -> Recognition:
    """recognition_of on a cursor of its own, closed after."""
    try:
        return recognition_of(cur)
    finally:
        cur.close()


def recognition_of(con: duckdb.DuckDBPyConnection) -> Recognition:
    """Spans in the store and the request spans among them, by `tailscope.engine`."""
    from analysis.engine.connect import request_engines
    from intake.recognition import Recognition

    spans, requests = con.execute(
        "SELECT count(*), count(*) FILTER (WHERE IsRequest) FROM spans").fetchone() or (0, 0)
    return Recognition(int(spans), int(requests), request_engines(con))
