"""The dashboard's server: `streamlit run` serves this `st.App` (Streamlit's ASGI entry point), which runs the
router app.py in each session and, at start-up, imports what every page needs, opens the store named by
`--store` and computes its unfiltered Overview before it serves.

Without it the first visitor of a server just started pays those imports (the analysis stack, Polars, PyArrow:
seconds on a loaded machine), the store's opening and the Overview's numbers (its spikes, summary and series).
The warm-up runs in a thread of the server's own process, on no network. The server answers (its health check
too) once the warm-up has the Overview's numbers, or after READY_WAIT_S, whichever comes first: its port is bound
before, so a browser that connects meanwhile waits for the answer instead of being refused. The rest of the warm-up
(the spike report the Spike page explains, the other pages' imports), or a warm-up still running, then goes on in
the background: a session that arrives mid-import waits for the module being imported
(Python's import lock), one that arrives mid-open for the workbench being opened, and one that reaches a number
being computed for that computation (Streamlit's cache computes each key once). A store whose critical paths are
still to be computed (a big store never materialized) is served as soon as it opens: its pages render from the
request facts meanwhile (docs/dashboard.md).

Every page's HTML also names the element scripts the page draws (dashboard.preload), so that a new browser
fetches and compiles them while it loads Streamlit's own; asking for the HTML of a page with long work (Capacity,
Cost) starts that work on the opened store (`PageWork`), so that it runs while the browser loads; and the server's
connections send each response at once (`nodelay_listeners`), not a Nagle delay after its headers.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import socket
import stat
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.middleware import Middleware
from streamlit.starlette import App

from dashboard.preload import PreloadHints, page_of

if TYPE_CHECKING:
    from dashboard.data import Workbench

HERE = Path(__file__).parent
#: the modules the router and every page import before drawing anything (app.py's own imports, and theirs)
WARM_MODULES = ("dashboard.data", "dashboard.sidebar", "dashboard.charts", "dashboard.formats", "dashboard.links")
#: the longest the server waits for its warm-up before it serves (seconds); a bigger store's goes on behind
READY_WAIT_S = 30.0
#: the store the start-up opened (`warm_store`), whose pages' unfiltered work `PageWork` starts
OPENED: Workbench | None = None


def warm_imports(modules: tuple[str, ...] = WARM_MODULES) -> None:
    """Import `modules`; a failure is left for the session that needs the module to report."""
    for name in modules:
        with contextlib.suppress(Exception):
            importlib.import_module(name)


def warm_store(argv: list[str] | None = None, wait_s: float = READY_WAIT_S) -> None:
    """Open the store that `--store DIR` names in `argv` (the app's arguments; default sys.argv[1:]) as the first
    session would (dashboard.data.workbench), then wait up to `wait_s` for its warm-up to have the unfiltered
    Overview's numbers (not when its critical paths are still to be computed); nothing without --store (a
    ClickHouse table, or the default store) or with another engine. The store opened is kept in `OPENED`. A failure
    is left for the session that opens the store to report."""
    global OPENED
    args = sys.argv[1:] if argv is None else argv
    if not any(a == "--store" or a.startswith("--store=") for a in args):
        return
    with contextlib.suppress(Exception):
        from dashboard import data

        if data.engine_args(args)[0] == "duckdb":
            wb = OPENED = data.workbench(str(data.store_path(args)))
            if not wb.pending:
                wb.overview_warmed.wait(wait_s)


def warm_up() -> None:
    """The start-up's warm-up: the imports, then the store and its Overview."""
    warm_imports()
    warm_store()


def nodelay_listeners(fd_dir: str = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd",
                      limit: int = 10_000) -> int:
    """Turn Nagle's algorithm off (TCP_NODELAY) on this process's listening TCP sockets (among the first `limit`
    open files), so that the connections they accept from now on inherit it, as Linux and the BSDs copy it; how many
    were set. Streamlit binds its socket without naming the TCP protocol, so asyncio leaves Nagle on for its
    connections, and each response's body, written after its headers, then waits for the browser's delayed
    acknowledgement (about 40 ms) on every request of a kept-alive connection: a new browser profile's first page
    makes 65-125 requests over 6 connections."""
    done = 0
    with contextlib.suppress(OSError):
        for name in os.listdir(fd_dir)[:limit]:
            with contextlib.suppress(OSError, ValueError):
                fd = int(name)
                if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                    continue
                dup = os.dup(fd)  # a duplicate: closing it leaves the socket open
                try:
                    sock = socket.socket(fileno=dup)
                except OSError:
                    os.close(dup)
                    raise
                with sock:
                    if (sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM
                            and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)):
                        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        done += 1
    return done


class PageWork:
    """ASGI middleware: a browser asking for a page's HTML with no query string (no filters in its URL) starts that
    page's unfiltered work on the store the start-up opened (dashboard.data.start_page_work: the Capacity page's
    replays), which then runs while the browser loads the app and opens its session; the request itself passes
    untouched. A session's own clicks fetch no HTML: only a page opened by its URL (a new tab, a reload, a link)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        page, db = page_of(scope), OPENED
        if page and db is not None and not scope.get("query_string"):
            from dashboard import data  # imported by the start-up that opened the store

            if page in data.PAGE_WORK:
                data.start_page_work(db, page)
        await self.app(scope, receive, send)


@contextlib.asynccontextmanager
async def _lifespan(_app: App) -> AsyncIterator[dict[str, Any]]:
    """Turn Nagle off for the connections to come (`nodelay_listeners`), start the warm-up in a thread and serve once
    it is done, or after READY_WAIT_S (it then goes on behind)."""
    nodelay_listeners()
    warm = threading.Thread(target=warm_up, name="tailscope-warm-imports", daemon=True)
    warm.start()
    await asyncio.to_thread(warm.join, READY_WAIT_S)
    yield {}


app = App(HERE / "app.py", lifespan=_lifespan, middleware=[Middleware(PageWork), Middleware(PreloadHints)])
