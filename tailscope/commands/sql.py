"""`tailscope sql`: run one SQL query over the store's views."""

from __future__ import annotations

import csv
import enum
import json
import sys
from datetime import date, datetime
from decimal import Decimal
from typing import Annotated, Any

import typer

from tailscope.commands.common import (
    DEFAULT,
    DsnOption,
    Engine,
    EngineOption,
    MappingOption,
    MaterializeOption,
    StoreOption,
    TableOption,
    console,
)
from tailscope.commands.engine import open_backend

#: Third-party packages the command needs (imported when it runs, so `tailscope --help` starts fast).
NEEDS = ("duckdb", "polars", "pyarrow")


class OutputFormat(enum.StrEnum):
    """How `tailscope sql` prints its result."""

    table = "table"
    csv = "csv"
    json = "json"


def _json_default(value: Any) -> Any:
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def sql(
    query: Annotated[str, typer.Argument(help="A SQL query over the views spans, requests, stages.")],
    store: StoreOption = None,
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f", help="Output format.")] = OutputFormat.table,
    materialize: MaterializeOption = True,
    engine: EngineOption = Engine.duckdb,
    dsn: DsnOption = None,
    table: TableOption = DEFAULT,
    mapping: MappingOption = None,
) -> None:
    """Query the store with SQL (DuckDB dialect); see docs/schema.md for the views.

    With --engine clickhouse the query is ClickHouse SQL over the same views, computed from the
    otel_traces table, and runs with readonly = 1. A result wider than the terminal prints one
    block per row (name | value); an empty one still names its columns.
    """
    names, rows = open_backend(engine, store, dsn, table, mapping).sql(query, materialize)
    _print(fmt, names, rows)


def _print(fmt: OutputFormat, names: list[str], rows: list[tuple[Any, ...]]) -> None:
    if fmt is OutputFormat.csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(names)
        writer.writerows(rows)
    elif fmt is OutputFormat.json:
        sys.stdout.write(json.dumps([dict(zip(names, row, strict=True)) for row in rows],
                                    default=_json_default) + "\n")
    else:
        print_table(names, rows)


def fits(names: list[str], width: int) -> bool:
    """True when every header fits on one line side by side (rich squeezes wider tables to blank headers)."""
    return sum(len(n) for n in names) + 3 * len(names) + 1 <= width


def print_table(names: list[str], rows: list[tuple[Any, ...]]) -> None:
    """A table when the headers fit the terminal, else one block per row (name: value), as psql's \\x.

    An empty result still names its columns.
    """
    cells = [["" if v is None else str(v) for v in row] for row in rows]
    if fits(names, console.width):
        from rich.table import Table  # here: imported by every command's start-up otherwise

        table = Table(*names, show_lines=False)
        for column in table.columns:
            column.min_width = len(str(column.header))
        for row in cells:
            table.add_row(*row)
        console.print(table)
    elif not cells:
        console.print("columns: " + ", ".join(names), highlight=False, soft_wrap=True)
    else:
        pad = max(len(n) for n in names)
        for i, row in enumerate(cells, 1):
            console.print(f"-[ row {i} ]" + "-" * max(0, min(console.width, 40) - 10 - len(str(i))),
                          style="dim", highlight=False)
            for name, value in zip(names, row, strict=True):
                console.print(f"{name.ljust(pad)} | {value}", highlight=False, soft_wrap=True, markup=False)
    console.print(f"{len(rows)} row(s)", style="dim")


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("sql")(sql)
