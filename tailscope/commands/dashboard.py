"""`tailscope dashboard`: serve the Streamlit incident workbench over a store (loopback by default)."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from tailscope.commands.common import StoreOption, err_console, errors_as_messages, fail, store_path
from tracing.store import ENV_STORE, require_store

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def app_file() -> Path:
    """The dashboard's router file, found without importing the dashboard package (nor Streamlit)."""
    spec = importlib.util.find_spec("dashboard")
    if spec is None or not spec.submodule_search_locations:
        fail("the dashboard package is not installed; install tailscope with the [dashboard] extra")
    path = Path(next(iter(spec.submodule_search_locations))) / "app.py"
    if not path.is_file():
        fail(f"{path}: the dashboard's app.py is missing; reinstall tailscope")
    return path


def streamlit_command(app: Path, store: Path, host: str, port: int) -> list[str]:
    """The `streamlit run` command line that serves `app` over `store`, headless, on host:port."""
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
        "--", "--store", str(store),
    ]


def dashboard(
    store: StoreOption = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on (loopback by default; the dashboard "
                                                     "has no login, so expose it only behind one).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p", help="Port to listen on.", min=1, max=65535)] = 8501,
) -> None:
    """Open the incident workbench in a browser: p99 over time, spikes, what explains them, traces, SQL."""
    with errors_as_messages():
        path = require_store(store_path(store)).resolve()
    if importlib.util.find_spec("streamlit") is None:
        fail("Streamlit is not installed; install tailscope with the [dashboard] extra: "
             "pip install 'tailscope[dashboard]'")
    app = app_file()
    if host not in LOOPBACK:
        err_console.print(f"[yellow]warning:[/] listening on {host}: anyone who can reach it can read the store")
    err_console.print(f"tailscope dashboard on http://{'[' + host + ']' if ':' in host else host}:{port} "
                      f"(store {path}); Ctrl-C to stop", highlight=False)
    env = {**os.environ, ENV_STORE: str(path)}
    raise typer.Exit(_serve(streamlit_command(app, path, host, port), env))


def _serve(argv: list[str], env: dict[str, str]) -> int:
    """Run the server until it exits; Ctrl-C or SIGTERM stop it too (no orphaned Streamlit)."""
    child = subprocess.Popen(argv, env=env)

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
