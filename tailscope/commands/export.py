"""`tailscope export --to clickhouse`: move a store into an otel_traces table without loss."""

from __future__ import annotations

import enum
from typing import Annotated

import typer

from tailscope.commands.common import (
    DEFAULT,
    StoreOption,
    TableOption,
    byte_progress,
    clickhouse_client,
    console,
    errors_as_messages,
    store_path,
)


class Target(enum.StrEnum):
    """Where an export goes."""

    clickhouse = "clickhouse"


def export(
    to: Annotated[Target, typer.Option("--to", help="Target engine.")],
    dsn: Annotated[str, typer.Option(
        "--dsn", help="chdb:PATH (embedded) or clickhouse://user[:password]@host:8123/db.")],
    store: StoreOption = None,
    table: TableOption = DEFAULT,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Copy every span of the store into an otel_traces-shaped table (created if missing) that it does not hold.

    Run again, it adds no span twice (each span's trace and span id are looked up among the
    table's spans of the segment's time range).

    Timestamps keep their ns, events are mapped field by field, and promoted facts an engine
    mapping set (request, stage, outcome, TTFT, replica, ...) are written as the convention's
    attributes, so `report --engine clickhouse` reads the same requests (docs/scale-out.md).
    """
    from analysis.clickhouse.export import export_store
    from tracing.store import require_store, segment_files

    with errors_as_messages():
        path = require_store(store_path(store))
        total = sum(f.stat().st_size for f in segment_files(path))
        client = clickhouse_client(dsn, table)
        try:
            with byte_progress(total, f"export to {table}", enabled=not quiet) as advance:
                done = export_store(path, client, table, on_segment=lambda size, _n: advance(size))
        finally:
            client.close()
    held = done.spans - done.written
    console.print(f"exported {done.written:,} spans from {done.segments} segment(s) into {table}"
                  + (f" ({held:,} of the {done.spans:,} read were there already)" if held else ""), highlight=False)


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("export")(export)
