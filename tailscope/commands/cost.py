"""`tailscope cost`: fair-share GPU time and its cost per tenant, model, model version or replica."""

from __future__ import annotations

import enum
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from tailscope.commands.common import StoreOption, console, errors_as_messages, fail, store_path

#: Third-party packages the command needs (imported when it runs, so `tailscope --help` starts fast).
NEEDS = ("duckdb", "polars", "numpy", "pyarrow")


class By(enum.StrEnum):
    """What the cost table is grouped by."""

    tenant = "tenant"
    model = "model"
    model_version = "model_version"
    replica = "replica"


def _usd(x: float | None) -> str:
    return "-" if x is None else f"${x:,.2f}"


def _share(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def render_text(result: dict[str, Any]) -> None:
    """Print the cost table and the replicas' time as rich tables."""
    from rich.table import Table  # here: imported by every command's start-up otherwise

    t = Table(result["by"], "GPU-s", "cost", "requests", "in tokens", "out tokens", "$/1k out", "p99 tail GPU",
              title="fair-share GPU time")
    for r in result["rows"]:
        per_k = r["usd_per_1k_output_tokens"]
        t.add_row(r["key"], f"{r['gpu_seconds']:,.1f}", _usd(r["cost_usd"]), f"{r['requests']:,}",
                  f"{r['input_tokens']:,}", f"{r['output_tokens']:,}", "-" if per_k is None else f"${per_k:.4f}",
                  _share(r["tail_gpu_share"]))
    console.print(t)
    t = Table("replica", "observed s", "allocated s", "cold start s", "idle s", "idle share", title="replicas")
    for r in result["replicas"]:
        t.add_row(r["replica"], f"{r['observed_seconds']:,.1f}", f"{r['allocated_seconds']:,.1f}",
                  f"{r['cold_start_seconds']:,.1f}", f"{r['idle_seconds']:,.1f}", _share(r["idle_share"]))
    console.print(t)
    tot = result["totals"]
    line = (f"idle share {_share(tot['idle_share'])}; allocated {_usd(tot['allocated_usd'])}, "
            f"idle + cold start {_usd(tot['overhead_usd'])}")
    if tot["allocated_usd"] is None:
        line += " (no price: give --gpu-hour-usd or a price table, docs/cost.md)"
    console.print(line, highlight=False)


def cost(
    store: StoreOption = None,
    by: Annotated[By, typer.Option("--by", help="Group the GPU time by this request column.")] = By.tenant,
    since: Annotated[str | None, typer.Option(
        "--since", help="Only GPU time at or after this time, and requests starting then (ISO-8601, UTC if no zone).",
        show_default=False)] = None,
    until: Annotated[str | None, typer.Option(
        "--until", help="Only GPU time before this time, and requests starting before it (ISO-8601, UTC if no zone).",
        show_default=False)] = None,
    gpu_hour_usd: Annotated[float | None, typer.Option(
        "--gpu-hour-usd", help="USD per GPU-hour for every replica (replaces the price table's default).",
        show_default=False)] = None,
    prices: Annotated[Path | None, typer.Option(
        "--prices", help="Price table (TOML, docs/cost.md); default: prices.toml in the store, if any.",
        show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the JSON contract (docs/cost.md).")] = False,
) -> None:
    """GPU-seconds and cost per tenant / model / version / replica, with idle, cold start and the p99 tail's share."""
    import duckdb

    from analysis.cost import cost_table, prices_for
    from analysis.engine.connect import connect

    with errors_as_messages():
        path = store_path(store)
        table = prices_for(path, prices, gpu_hour_usd)
        con = connect(path)
        try:
            con.execute("SET enable_progress_bar = false").fetchall()
            result = cost_table(con, by=by.value, since=since, until=until, prices=table)
        except duckdb.Error as exc:
            fail(f"cost failed: {str(exc).splitlines()[0]}")
        finally:
            con.close()
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    else:
        render_text(result)


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("cost")(cost)
