"""The `tailscope` command line: one typer app; each command lives in analysis/commands/."""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="tailscope",
    help="Tail-latency observability for inference serving: ingest traces, collect OTLP, "
    "report p99 spikes and what explains them, query with SQL, open the dashboard.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

#: Command modules, in the order `--help` lists them; each has `register(app)`.
COMMANDS: tuple[str, ...] = ("ingest", "sql", "report", "cost", "collect", "dashboard", "demo")

for _name in COMMANDS:
    try:
        _module = importlib.import_module(f"analysis.commands.{_name}")
    except ModuleNotFoundError as exc:  # a command whose module is not there yet
        if exc.name != f"analysis.commands.{_name}":
            raise
        continue
    _module.register(app)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
