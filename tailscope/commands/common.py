"""Shared pieces of the commands: the --store option, error reporting, progress bars."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

from tracing.errors import TailscopeError
from tracing.store import ENV_STORE, default_store

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
        "ones read the files); --no-materialize computes them on the fly and writes nothing.",
    ),
]


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
    """Materialize the store's settled hours that are stale or missing (analysis.materialize), as `collect`
    does, so stores written without `collect` or `ingest` get fast too; a store we cannot write is read as is."""
    import duckdb

    from analysis.materialize import SETTLE_NS, materialize

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
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                  TimeRemainingColumn(), console=err_console, transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)
