"""The dashboard's server: `streamlit run` serves this `st.App` (Streamlit's ASGI entry point), which runs the
router app.py in each session and, at start-up, imports what every page needs in a background thread.

Without it the first visitor of a server just started pays those imports (the analysis stack, Polars, PyArrow:
seconds on a loaded machine). The warm-up runs in the server's own process, on no network, and never delays the
server's start: a session that arrives mid-import waits for the module being imported (Python's import lock).
"""

from __future__ import annotations

import contextlib
import importlib
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


@contextlib.asynccontextmanager
async def _lifespan(_app: App) -> AsyncIterator[dict[str, Any]]:
    """Start the warm-up beside the server and yield at once (the server starts without waiting for it)."""
    threading.Thread(target=warm_imports, name="tailscope-warm-imports", daemon=True).start()
    yield {}


app = App(HERE / "app.py", lifespan=_lifespan)
