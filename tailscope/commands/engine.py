"""The --engine / --dsn / --table options shared by `report` and `sql` (ClickHouse as the second engine)."""

from __future__ import annotations

import enum
from typing import Annotated

import typer

from analysis.clickhouse import DEFAULT_TABLE, Client, check_table_name, open_client
from tailscope.commands.common import fail


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
DEFAULT = DEFAULT_TABLE


def clickhouse_client(dsn: str | None, table: str) -> Client:
    """The client of --dsn after checking --table; a one-line error when --dsn is missing."""
    if not dsn:
        fail("--engine clickhouse needs --dsn (chdb:PATH or clickhouse://user@host:8123/db)")
    check_table_name(table)
    return open_client(dsn)
