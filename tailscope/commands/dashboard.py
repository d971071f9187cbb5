"""`tailscope dashboard`: serve the Streamlit incident workbench over a store (loopback by default)."""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from tailscope.commands.common import (
    DEFAULT,
    DsnOption,
    Engine,
    EngineOption,
    StoreOption,
    TableOption,
    err_console,
    fail,
)
from tailscope.commands.engine import open_backend

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def app_file() -> Path:
    """The dashboard's server file (dashboard/server.py: the router app.py served as an `st.App` that warms the
    pages' imports at start-up), found without importing the dashboard package (nor Streamlit)."""
    spec = importlib.util.find_spec("dashboard")
    if spec is None or not spec.submodule_search_locations:
        fail("the dashboard package is not installed; install tailscope with the [dashboard] extra")
    path = Path(next(iter(spec.submodule_search_locations))) / "server.py"
    if not path.is_file():
        fail(f"{path}: the dashboard's server.py is missing; reinstall tailscope")
    return path


def streamlit_command(app: Path, app_args: list[str], host: str, port: int) -> list[str]:
    """The `streamlit run` command line that serves `app` headless on host:port; `app_args`: what the app reads
    (`--store DIR`, or the ClickHouse engine and table whose DSN rides in the environment)."""
    return [
        sys.executable, "-m", "streamlit", "run", str(app),
        "--server.address", host,
        "--server.port", str(port),
        "--server.headless", "true",
        "--server.runOnSave", "false",
        "--server.fileWatcherType", "none",
        "--browser.gatherUsageStats", "false",
        "--global.developmentMode", "false",
        "--client.toolbarMode", "viewer",
        # no "magic" (a bare expression drawn as st.write): no page relies on it, and without it a session that
        # starts with no other open compiles the router and its page without an extra parse of each
        "--runner.magicEnabled", "false",
        "--", *app_args,
    ]


def dashboard(
    store: StoreOption = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on (loopback by default; the dashboard "
                                                     "has no login, so expose it only behind one).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p", help="Port to listen on.", min=1, max=65535)] = 8501,
    engine: EngineOption = Engine.duckdb,
    dsn: DsnOption = None,
    table: TableOption = DEFAULT,
) -> None:
    """Open the incident workbench in a browser: p99 over time, spikes, what explains them, traces, SQL.

    With --engine clickhouse the pages read an otel_traces table: Overview, Spike, Traces and
    SQL run there; the others say they need a store.
    """
    served = open_backend(engine, store, dsn, table).served()
    if importlib.util.find_spec("streamlit") is None:
        fail("Streamlit is not installed; install tailscope with the [dashboard] extra: "
             "pip install 'tailscope[dashboard]'")
    app = app_file()
    if host not in LOOPBACK:
        err_console.print(f"[yellow]warning:[/] listening on {host}: anyone who can reach it can read the "
                          f"{served.what}")
    err_console.print(f"tailscope dashboard on http://{'[' + host + ']' if ':' in host else host}:{port} "
                      f"({served.what}); Ctrl-C to stop", highlight=False)
    raise typer.Exit(_serve(streamlit_command(app, served.args, host, port), {**os.environ, **served.env}))


def _die_with_parent() -> None:
    """In the Streamlit child before exec: SIGTERM when this command dies, even by SIGKILL (Linux's
    prctl(PR_SET_PDEATHSIG); elsewhere nothing), so a killed `tailscope dashboard` leaves no server behind."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # 1: PR_SET_PDEATHSIG


def _serve(argv: list[str], env: dict[str, str]) -> int:
    """Run the server until it exits; Ctrl-C or SIGTERM stop it too, and it dies with this process (no orphaned
    Streamlit)."""
    child = subprocess.Popen(argv, env=env, preexec_fn=_die_with_parent)

    def _stop(signum: int, _frame: object) -> None:
        child.send_signal(signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        return child.wait()
    except KeyboardInterrupt:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("dashboard")(dashboard)
