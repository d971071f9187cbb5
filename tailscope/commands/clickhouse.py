"""`tailscope clickhouse init`: the DDL of the materialized `tailscope_requests` table on ClickHouse."""

from __future__ import annotations

from typing import Annotated

import typer

from tailscope.commands.common import DEFAULT, TableOption, clickhouse_client, console, errors_as_messages

clickhouse_app = typer.Typer(help="ClickHouse helpers: the materialized requests table.", no_args_is_help=True)


@clickhouse_app.command("init")
def init(
    dsn: Annotated[str, typer.Option(
        "--dsn", help="chdb:PATH (embedded) or clickhouse://user[:password]@host:8123/db.")],
    table: TableOption = DEFAULT,
    every: Annotated[str, typer.Option("--every", help="Refresh interval (ClickHouse interval, e.g. '5 MINUTE').")]
    = "5 MINUTE",
    lag: Annotated[int, typer.Option("--lag-minutes", help="Requests younger than this are left to the next "
                                     "refresh (their spans may still be arriving).")] = 10,
    apply: Annotated[bool, typer.Option("--apply", help="Run the DDL instead of printing it.")] = False,
) -> None:
    """Print (or apply) a tailscope_requests table and the refreshable materialized view that fills it."""
    from analysis.clickhouse import requests_mv_ddl

    with errors_as_messages():
        statements = requests_mv_ddl(table, every=every, lag_minutes=lag)
        if not apply:
            console.print(";\n\n".join(statements) + ";", highlight=False, markup=False, soft_wrap=True)
            return
        client = clickhouse_client(dsn, table)
        try:
            for sql in statements:
                client.command(sql)
        finally:
            client.close()
    console.print(f"created tailscope_requests and tailscope_requests_mv over {table}", highlight=False)


def register(app: typer.Typer) -> None:
    """Add the command group to the app."""
    app.add_typer(clickhouse_app, name="clickhouse")
