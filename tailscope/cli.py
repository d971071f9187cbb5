"""The `tailscope` command line: one typer app; each command lives in tailscope/commands/.

Every command module is imported here and a failure to import one is an error, never a
silently missing command. The one exception is a third-party package that an extra
installs: the command is still listed and says, in one line, which extra to install.
Command modules import their heavy packages (duckdb, polars, pyarrow, the analysis) inside
the command, so start-up and `--help` stay fast; each names them in `NEEDS`, looked up here
without importing them.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
from typing import Any

try:
    import typer
except ModuleNotFoundError as _exc:  # the bare package: the serving-side library only
    raise SystemExit(f"the tailscope command needs {_exc.name}, which is not installed: "
                     "pip install 'tailscope[analysis]' (or [collect], [dashboard], [all])") from None

app = typer.Typer(
    name="tailscope",
    help="Tail-latency observability for inference serving: ingest traces, collect OTLP, "
    "report p99 spikes and what explains them, query with SQL, open the dashboard.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

#: Command modules, in the order `--help` lists them, each with `register(app)`, and the extra it needs.
EXTRAS: dict[str, str] = {
    "ingest": "collect",
    "sql": "analysis",
    "map": "analysis",
    "report": "analysis",
    "collect": "collect",
    "compact": "collect",
    "store": "analysis",
    "metrics": "collect",
    "dashboard": "dashboard",
    "demo": "all",
    "watch": "analysis",
    "cost": "analysis",
    "export": "clickhouse",
    "clickhouse": "clickhouse",
}
COMMANDS: tuple[str, ...] = tuple(EXTRAS)
OURS = ("tracing", "intake", "analysis", "dashboard", "tailscope", "sample_traces")


def _needs_extra(name: str, missing: str) -> None:
    """List `name` as a command that says, in one line, which extra installs `missing`."""
    extra = EXTRAS[name]
    message = f"tailscope {name} needs {missing}, which is not installed: pip install 'tailscope[{extra}]'"

    def command(ctx: typer.Context) -> None:
        raise SystemExit(message)

    settings: dict[str, Any] = {"ignore_unknown_options": True, "allow_extra_args": True}
    app.command(name, help=f"(not installed) {message}", context_settings=settings, add_help_option=False)(command)


for _name in COMMANDS:
    try:
        _module = importlib.import_module(f"tailscope.commands.{_name}")
    except ModuleNotFoundError as exc:
        if not exc.name or exc.name.split(".")[0] in OURS:
            raise  # our own module is missing or broken: a bug, never a silently absent command
        _needs_extra(_name, exc.name)
        continue
    _absent = [m for m in getattr(_module, "NEEDS", ()) if importlib.util.find_spec(m) is None]
    if _absent:
        _needs_extra(_name, _absent[0])
        continue
    _module.register(app)

# what start-up imported (typer, rich, the command modules) lives as long as the process: out of the collector's
# reach, the full collections the command's own imports set off (DuckDB, polars, ...) do not scan it again
gc.freeze()


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    finally:
        # the process ends here. Its teardown runs full garbage collections over every object the command left
        # (the imported packages': 0.15-0.5 s after a report, longer than some commands' work); frozen, they
        # are still freed by reference counting, only never scanned for cycles again
        gc.freeze()


if __name__ == "__main__":
    main()
