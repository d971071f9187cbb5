"""The dashboard's server: `streamlit run` serves this `st.App` (Streamlit's ASGI entry point), which runs the
router app.py in each session and, at start-up, imports what every page needs and opens the store named by
`--store` in a background thread.

Without it the first visitor of a server just started pays those imports (the analysis stack, Polars, PyArrow:
seconds on a loaded machine) and the store's opening (its workbench, which then computes the unfiltered
Overview's numbers in its own warm-up). The warm-up runs in the server's own process, on no network, and never
delays the server's start: a session that arrives mid-import waits for the module being imported (Python's import
lock), one that arrives mid-open for the workbench being opened (Streamlit's cache computes each key once).
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from streamlit.starlette import App

HERE = Path(__file__).parent
#: the modules the router and every page import before drawing anything (app.py's own imports, and theirs)
WARM_MODULES = ("dashboard.data", "dashboard.sidebar", "dashboard.charts", "dashboard.formats", "dashboard.links")


def warm_imports(modules: tuple[str, ...] = WARM_MODULES) -> None:
    """Import `modules`; a failure is left for the session that needs the module to report."""
    for name in modules:
        with contextlib.suppress(Exception):
            importlib.import_module(name)


def warm_store(argv: list[str] | None = None) -> None:
    """Open the store that `--store DIR` names in `argv` (the app's arguments; default sys.argv[1:]) as the first
    session would (dashboard.data.workbench); nothing without --store (a ClickHouse table, or the default store) or
    with another engine. A failure is left for the session that opens the store to report."""
    args = sys.argv[1:] if argv is None else argv
    if not any(a == "--store" or a.startswith("--store=") for a in args):
        return
    with contextlib.suppress(Exception):
        from dashboard import data

        if data.engine_args(args)[0] == "duckdb":
            data.workbench(str(data.store_path(args)))


def warm_up() -> None:
    """The start-up's background work: the imports, then the store."""
    warm_imports()
    warm_store()


@contextlib.asynccontextmanager
async def _lifespan(_app: App) -> AsyncIterator[dict[str, Any]]:
    """Start the warm-up beside the server and yield at once (the server starts without waiting for it)."""
    threading.Thread(target=warm_up, name="tailscope-warm-imports", daemon=True).start()
    yield {}


app = App(HERE / "app.py", lifespan=_lifespan)
