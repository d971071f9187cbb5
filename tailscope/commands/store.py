"""`tailscope store`: how the store is (hours, segments, bytes, spans, span range, compaction lag, retention)."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import Annotated

import typer

from tailscope.commands.common import StoreOption, errors_as_messages, store_path
from tailscope.commands.sql import print_table

#: Third-party packages the command needs.
NEEDS = ("pyarrow",)


def _iso(ns: int | None) -> str:
    return "-" if ns is None else datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%d %H:%M:%S")


def store(
    store: StoreOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (every figure, and one row per hour).")] = False,
    hours: Annotated[bool, typer.Option("--hours", help="Also print one row per hour.")] = False,
) -> None:
    """Say how the store is: hours, segments, bytes, spans, oldest and newest span, compaction lag, retention.

    Compaction lag is how long the oldest settled hour still holding small or unsorted segments
    has waited since it settled (0 while the compactor keeps up): an hour settles once it is over and
    its segments are quiet, so an old hour backfilled just now waits from its last write. Retention is
    what the last compactor (`tailscope collect` or `tailscope compact`) applied.
    """
    from analysis.engine.store_status import store_status, summary_line

    with errors_as_messages():
        status = store_status(store_path(store))
    d = status.as_dict()
    if as_json:
        sys.stdout.write(json.dumps(d) + "\n")
        return
    last = d["last_compaction_ns"]
    ago = f"{(status.now_s - last / 1e9):,.0f} s ago" if last else "never"
    sys.stdout.write(f"store {d['store']}: {summary_line(status)}\n"
                     f"spans from {_iso(d['oldest_span_ns'])} to {_iso(d['newest_span_ns'])} UTC; "
                     f"last compaction pass {ago}; {d['quarantined']} segment(s) in quarantine\n")
    if hours:
        print_table(["hour (UTC)", "segments", "uncompacted", "hidden", "MB", "spans", "pending"],
                    [(_iso(h.hour_ns)[:13] + "h", h.files, h.uncompacted, h.hidden, round(h.bytes / 1e6, 1),
                      h.spans, "yes" if h.pending else "") for h in status.hours])


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("store")(store)
