"""Shared pieces of the commands: the --store option, the engine options, error reporting, progress bars."""

from __future__ import annotations

import enum
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console

from tracing.errors import TailscopeError
from tracing.store import ENV_STORE, default_store

if TYPE_CHECKING:
    from analysis.clickhouse import Client

err_console = Console(stderr=True)
console = Console()

StoreOption = Annotated[
    Path | None,
    typer.Option(
        "--store",
        "-s",
        help=f"Store directory (default: ${ENV_STORE}, else ~/.local/share/tailscope/store).",
        show_default=False,
    ),
]

MaterializeOption = Annotated[
    bool,
    typer.Option(
        "--materialize/--no-materialize",
        help="First store the requests of settled hours not materialized yet (this run pays the build, later "
        "ones read the files); --no-materialize computes them on the fly and writes nothing. With --engine "
        "clickhouse: read tailscope_requests where it is current (`tailscope clickhouse init`); "
        "--no-materialize computes every request from the spans.",
    ),
]


MappingOption = Annotated[
    Path | None,
    typer.Option(
        "--mapping",
        help="A mapping file (tailscope-map.json, as `tailscope map` saves it in a store): report and sql with "
        "--engine clickhouse compile its rules to ClickHouse SQL over the table; collect saves it in its store.",
        show_default=False,
    ),
]


def read_mapping(path: Path) -> Any:
    """The analysis.mapping.Mapping in a mapping file; one line naming the file when it is not one."""
    from analysis.mapping.rules import load_text

    try:
        text = path.read_text()
    except OSError as exc:
        fail(f"--mapping {path}: cannot read it ({exc.strerror})")
    try:
        return load_text(text, str(path))
    except TailscopeError as exc:
        fail(f"--mapping {exc}")


def store_path(store: Path | None) -> Path:
    """The store named on the command line, else the default store."""
    return store if store is not None else default_store()


def fail(message: str, code: int = 1) -> NoReturn:
    """Print a one-line error to stderr and exit with `code`."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@contextmanager
def errors_as_messages() -> Iterator[None]:
    """Turn tailscope's own errors into one-line messages and exit code 1."""
    try:
        yield
    except TailscopeError as exc:
        fail(str(exc))


def write_through(store: Path) -> None:
    """Materialize the store's settled hours that are stale or missing (analysis.engine.materialize), as `collect`
    does, so stores written without `collect` or `ingest` get fast too; a store we cannot write is read as is."""
    import duckdb

    from analysis.engine.materialize import SETTLE_NS, materialize

    try:
        materialize(store, settled_before_ns=time.time_ns() - SETTLE_NS)
    except (OSError, duckdb.Error) as exc:  # read-only store, full disk: the views compute those hours on the fly
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        err_console.print(f"note: requests not materialized ({reason}); computing them on the fly",
                          highlight=False, soft_wrap=True, markup=False)


@contextmanager
def byte_progress(total: int, label: str, enabled: bool = True) -> Iterator[Callable[[int], None]]:
    """A progress bar over `total` bytes; yields the function that advances it."""
    if not enabled:
        yield lambda _n: None
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn  # ingest only

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                  TimeRemainingColumn(), console=err_console, transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)

# --- the engine options of report / sql (ClickHouse as the second engine) ----------------


class Engine(enum.StrEnum):
    """Where the analysis runs."""

    duckdb = "duckdb"
    clickhouse = "clickhouse"


EngineOption = Annotated[Engine, typer.Option(
    "--engine", help="duckdb: the store on disk; clickhouse: an otel_traces table (needs --dsn).")]
DsnOption = Annotated[str | None, typer.Option(
    "--dsn", help="ClickHouse: chdb:PATH (embedded) or clickhouse://user[:password]@host:8123/db.",
    show_default=False)]
TableOption = Annotated[str, typer.Option(
    "--table", help="ClickHouse: the spans table (the clickhouseexporter's otel_traces shape).")]
#: analysis.clickhouse.DEFAULT_TABLE, not imported here: the analysis package needs its extra, ingest does not
DEFAULT = "otel_traces"


def clickhouse_client(dsn: str | None, table: str) -> Client:
    """The client of --dsn after checking --table; a one-line error when --dsn is missing."""
    from analysis.clickhouse import check_table_name, open_client

    if not dsn:
        fail("--engine clickhouse needs --dsn (chdb:PATH or clickhouse://user@host:8123/db)")
    check_table_name(table)
    return open_client(dsn)


def store_hooks(store: Path) -> tuple[Callable[[int], None], Callable[[int], int]]:
    """What retention (intake.compact) needs from analysis, passed down as callbacks: remove an hour's
    materialized requests once its spans are gone, and count their bytes toward --max-store-gb.
    analysis is imported at the first call, not when a receiver starts."""

    def on_removed(hour_ns: int) -> None:
        from analysis.engine.materialize import remove_hour

        remove_hour(store, hour_ns)

    def extra_bytes(hour_ns: int) -> int:
        from analysis.engine.materialize import hour_bytes

        return hour_bytes(store, hour_ns)

    return on_removed, extra_bytes


def say(line: str) -> None:
    """Write one line to stderr (the compactor's messages)."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def query_failure(what: str, exc: Exception) -> str:
    """The one line for a failed query: when a file it had listed is gone (compaction merged it and the grace
    passed, or retention removed its hour while the query ran), say so and what to do, not DuckDB's words."""
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if "No files found that match" in first or "No such file or directory" in first:
        return (f"{what} failed: the store changed under it (a file it had listed was removed by compaction or "
                f"retention meanwhile); run it again ({first})")
    return f"{what} failed: {first}"
