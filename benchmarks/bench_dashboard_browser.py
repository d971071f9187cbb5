"""Dashboard benchmark in the real browser: each page's first render in a fresh session, and page clicks.

Starts `tailscope dashboard` on the demo store (`tailscope demo`'s, built in a temp directory unless
--store) on a loopback port, and drives Debian's chromium with Playwright:

1. the first session's Overview right after the server answers (it answers once its start-up has opened the
   store and cached the unfiltered Overview: dashboard/server.py);
2. every page once, each in a new browser context (a fresh Streamlit session, the server's caches warm,
   the browser's cache empty: a new browser profile downloads and compiles the app's scripts);
3. every page once, each in a new tab of one browser profile (a fresh Streamlit session; the browser's
   HTTP cache holds the app's scripts, as a user's browser does after a first visit of each page);
4. every page again, one sidebar click after another in one session (a click to the page drawn); with
   --think S, each click comes S seconds after the page before it was drawn, as a reader's does (the pages load
   the other pages' element scripts once drawn and quiet for 0.5 s: dashboard/preload.py);
5. once a round, without the browser: the static files (scripts, stylesheets, fonts) that the HTML of the Traces
   page names (of the bare page, for the anchor) fetched over 6 kept-alive connections, as a new browser profile
   fetches them: the serving side of a first load, apart from the browser's work.

A first render ends when the page is drawn: its heading is visible, no script runs (the app's run state, not
the status widget, which shows a run only after 500 ms), no element is a loading skeleton, every Vega-Lite
chart has drawn its SVG or canvas, and every table its canvas. Timed from `goto` (or the click) to that
moment. Beside each time: the CPU seconds of the browser's processes and of the server's (Linux /proc), the
renderer's main-thread busy time (Chromium's `Performance.getMetrics` TaskDuration) and what was fetched over
HTTP (requests, KB over the wire: 0 for what the browser's cache held) and the KB the server sent over the
session's websocket (the elements: chart data, tables, text). The anchor, in the same run and the
same browser: a bare Streamlit page (a title and a line of text) served by `streamlit run` with the
dashboard's own flags, in a new profile and in a new tab: what the framework itself costs on this machine.

    python -m benchmarks.bench_dashboard_browser [--store DIR] [--repeat 3] [--pages Overview,Spike,...] [--think 0]
        [--materialized [--live-hours N]] [--page-limit S] [--against TREE]

Without --store, or with one that does not exist yet, it writes the demo store first (there, or in a
temp directory removed afterwards). `--materialized` writes the store's stale hours' request files first, leaving
the last N hours live with `--live-hours N`, as benchmarks.bench_dashboard does (a 10 M-span store built by
`python -m benchmarks.bench_dashboard --spans 10000000 --keep`, whose pages' limit is 3 s: `--page-limit 3`).

With --against TREE (another checkout's directory, or a git ref of this repository, exported and built in a temp
directory as benchmarks.bench_against does), the same store is also served from that source tree: both servers are
up at once, each first render is measured on both trees in turn with the same browser, seconds apart, the pair's
order swapped every round (this, other; other, this; ...), so both see the same machine load, and each tree's clicks
run as one sequence after the other's; each tree's table is printed, then this tree's medians against the other's
(this / other).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import exit_on_termination

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
#: our packages: a server of another tree must load none of their compiled parts from this one
PACKAGES = ("tracing", "intake", "analysis", "dashboard", "tailscope")
#: (sidebar label, URL path, heading)
PAGES: tuple[tuple[str, str, str], ...] = (
    ("Overview", "", "Overview"), ("Spike", "spike", "Spike"), ("Alerts", "alerts", "Alerts"),
    ("Traces", "traces", "Traces"), ("Request shape", "shape", "Request shape"),
    ("Replicas", "replicas", "Replicas"), ("What-if", "whatif", "What-if"), ("Capacity", "capacity", "Capacity"),
    ("Cost", "cost", "Cost"), ("SQL", "sql", "SQL"),
)
#: The connections a browser opens to one HTTP/1.1 host (Chromium's limit): a new profile's first load fetches the
#: page's static files over them.
CONNECTIONS = 6
#: The page whose static files are fetched without the browser (`fetch_static`): the one that names the most.
STATIC_PAGE = ("traces", "Traces")
PAGE_LIMIT_S = 1.5
CLICK_LIMIT_S = 0.5
VIEWPORT: Any = {"width": 1440, "height": 1000}  # Playwright's ViewportSize
#: The anchor: a bare Streamlit page, the framework's own first render.
BARE_PAGE = 'import streamlit as st\n\nst.title("Hello")\nst.write("A bare Streamlit page.")\n'
BARE_HEADING = "Hello"
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Sample:
    """One timed render: wall seconds, CPU seconds of the browser and of the server, the renderer's main-thread
    busy seconds, the HTTP requests made and KB transferred over the wire, the KB the server sent over the
    session's websocket (the page's elements: chart data, tables, text), and the render's time split at the
    websocket's messages (`split`): until the server's first message, from it to the last, after the last."""

    wall_s: float
    browser_cpu_s: float
    server_cpu_s: float
    main_thread_s: float
    requests: int
    kbytes: float
    ws_kbytes: float = 0.0
    to_first_message_s: float = 0.0
    first_to_last_message_s: float = 0.0
    after_last_message_s: float = 0.0


#: In each document: every websocket message received, as [performance.now() ms, bytes], in `window.__tsMessages`.
MESSAGES_SCRIPT = """(() => {
    const Base = window.WebSocket, got = window.__tsMessages = [];
    window.WebSocket = class extends Base {
        constructor(...args) {
            super(...args);
            this.addEventListener('message', e => got.push([performance.now(),
                typeof e.data === 'string' ? e.data.length : (e.data.byteLength ?? e.data.size ?? 0)]));
        }
    };
})();"""


def split(messages: list[tuple[float, float]], act_ms: float, drawn_ms: float) -> tuple[float, float, float, float]:
    """A render's time split at its websocket messages (`messages`: [ms, bytes] on the page's clock) from the act
    (`act_ms`: the goto's navigation start, 0, or the click) to the page drawn (`drawn_ms`): (seconds until the
    first message, from the first to the last, after the last, KB received). What comes after the last message is
    the browser's own work (the server had sent everything); until the first, the page's load and the session's
    start; between them, the server's run as the browser sees it. No message: the whole time is before it."""
    got = [(t, n) for t, n in messages if act_ms <= t <= drawn_ms]
    if not got:
        return (drawn_ms - act_ms) / 1000, 0.0, 0.0, 0.0
    first, last = got[0][0], got[-1][0]
    return (first - act_ms) / 1000, (last - first) / 1000, (drawn_ms - last) / 1000, sum(n for _, n in got) / 1024


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants (Linux /proc; [] elsewhere)."""
    out: list[int] = []
    todo = [pid]
    while todo and len(out) < 10_000:  # bounded
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            with contextlib.suppress(OSError, ValueError):
                todo += [int(c) for c in (task / "children").read_text().split()]
    return out if Path("/proc").is_dir() else []


def _cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of `pids` so far (those gone count 0)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / _TICK


def _browser_pids() -> list[int]:
    """The chromium processes this benchmark started (through Playwright's driver)."""
    pids = []
    for pid in _tree(os.getpid()):
        with contextlib.suppress(OSError):
            if "chromium" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace"):
                pids.append(pid)
    return pids


def foreign_parts(pids: list[int], tree: Path) -> list[str]:
    """The compiled modules of our packages (`PACKAGES`) that processes `pids` have mapped from outside `tree`
    (Linux /proc; [] elsewhere): a server of `tree` that maps one measures a mix of trees."""
    root = str(tree.resolve()) + os.sep
    found: set[str] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                path = line.split(None, 5)[5] if len(line.split(None, 5)) == 6 else ""
                parts = Path(path).parts
                if (path.endswith(".so") and len(parts) > 1 and parts[-2] in PACKAGES
                        and not path.startswith(root)):
                    found.add(path)
    return sorted(found)


@contextlib.contextmanager
def other_tree(spec: str) -> Iterator[Path]:
    """The source tree `--against` names: a directory holding a checkout (its C parts built in place when it has
    none, as `make venv` builds them), or else a git ref of this repository, exported and built in a temporary
    directory removed at the end."""
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "dashboard" / "app.py").is_file() or not (path / "tailscope" / "__main__.py").is_file():
            sys.exit(f"--against {spec}: not a tailscope source tree (no dashboard/app.py, tailscope/__main__.py)")
        if (path / "setup.py").is_file() and not any(path.glob("*/_*.so")):
            print(f"building the C parts of {path} in place", file=sys.stderr)
            subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=path, check=True,
                           capture_output=True)
        yield path.resolve()
        return
    from benchmarks.bench_against import export_tree

    if subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{spec}^{{commit}}"], cwd=ROOT,
                      capture_output=True).returncode != 0:
        sys.exit(f"--against {spec}: neither a directory nor a git ref of this repository")
    with tempfile.TemporaryDirectory(prefix="ts-against-") as tmp:
        yield export_tree(spec, Path(tmp)).resolve()


@contextlib.contextmanager
def serving(store: Path | None, bare_dir: Path | None = None, tree: Path | None = None
            ) -> Iterator[tuple[str, list[int], Sample]]:
    """`tailscope dashboard --store STORE` on a free loopback port, from source tree `tree` (None: this benchmark's
    own), its modules first on the path whatever is installed (with `store` None: the bare page, written in
    `bare_dir`, served by `streamlit run` with the dashboard's flags); (its URL, its processes, its start: seconds
    and server CPU from the launch to its first answer to the health check). Stopped (its process group) at the
    end."""
    import httpx

    from tailscope.commands.dashboard import streamlit_command

    port = _free_port()
    env, cwd = None, None
    if store is None:
        assert bare_dir is not None
        app = bare_dir / "bare.py"
        app.write_text(BARE_PAGE)
        argv = streamlit_command(app, [], "127.0.0.1", port)
    else:
        tree = ROOT if tree is None else tree
        argv = [sys.executable, "-m", "tailscope", "dashboard", "--store", str(store), "--host", "127.0.0.1", "--port",
                str(port)]
        env, cwd = {**os.environ, "PYTHONPATH": str(tree)}, tree
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env=env, cwd=cwd)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):  # bounded: about a minute
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/_stcore/health", timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        else:
            raise RuntimeError("the dashboard did not start")
        pids = _tree(proc.pid)
        if store is not None and tree is not None and (foreign := foreign_parts(pids, tree)):
            raise RuntimeError(f"the server of {tree} loaded compiled parts of another tree: {', '.join(foreign)}")
        yield url, pids, Sample(time.perf_counter() - t0, 0.0, _cpu_s(pids), 0.0, 0, 0.0)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def static_files(url: str, path: str) -> list[str]:
    """The static files (scripts, stylesheets, fonts) the HTML of `url/path` names, as paths from `url`, once each:
    what a new browser profile fetches before the page can start its session."""
    import httpx

    html = httpx.get(f"{url}/{path}", timeout=30).text
    return list(dict.fromkeys(re.findall(r'(?:src|href)="\./(static/[^"]+)"', html)))


def fetch_static(url: str, path: str, server: list[int], connections: int = CONNECTIONS) -> Sample:
    """Fetch the static files of `url/path` (static_files) over `connections` kept-alive connections at once, as a
    new browser profile does but without the browser: the serving side of a first load (wall seconds, the server's
    CPU, requests, KB; no browser figures)."""
    import httpx

    files = static_files(url, path)
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    with httpx.Client(limits=limits, timeout=30) as client, ThreadPoolExecutor(connections) as pool:
        s0, t0 = _cpu_s(server), time.perf_counter()
        sizes = list(pool.map(lambda f: len(client.get(f"{url}/{f}").raise_for_status().content), files))
        wall, cpu = time.perf_counter() - t0, _cpu_s(server) - s0
    return Sample(wall, 0.0, cpu, 0.0, len(files), sum(sizes) / 1024)


def drawn(page: Any, heading: str) -> float:
    """Wait until the page is drawn: heading visible, no script running, no skeleton, each shown chart and table; the
    moment it was (`settled`)."""
    page.get_by_role("heading", name=heading, exact=True).first.wait_for(state="visible")
    return settled(page)


def settled(page: Any) -> float:
    """Wait until no script runs, no element is a loading skeleton and each shown chart and table has drawn (polled
    every 50 ms, up to 120 s); the moment it was seen so, on the page's clock (performance.now(), ms). "No script
    runs" is the app's own run state (`data-test-script-state`, which Streamlit's end-to-end tests wait on): the
    status widget shows a run only after its first 500 ms."""
    return float(page.wait_for_function("""() => {
        const app = document.querySelector('[data-testid=stApp]');
        if (!app || app.getAttribute('data-test-script-state') !== 'notRunning') return false;
        const w = document.querySelector('[data-testid=stStatusWidget]');
        if (w && /Running|Stop/.test(w.innerText)) return false;
        if (document.querySelector('[data-testid=stSkeleton]')) return false;
        const shown = e => e.checkVisibility();  // one inside a closed expander or tab is not drawn until opened
        const charts = [...document.querySelectorAll('[data-testid=stVegaLiteChart]')].filter(shown);
        const tables = [...document.querySelectorAll('[data-testid=stDataFrame]')].filter(shown);
        return charts.every(c => c.querySelector('svg, canvas')) && tables.every(t => t.querySelector('canvas'))
            && performance.now();
    }""", polling=50, timeout=120_000).json_value())


class Meter:
    """Measures one render in a page: wall time, CPU of the browser and the server, main-thread time, fetches."""

    def __init__(self, page: Any, server: list[int]) -> None:
        self.page, self.server = page, server
        self.cdp = page.context.new_cdp_session(page)
        self.cdp.send("Performance.enable")
        page.add_init_script(MESSAGES_SCRIPT)  # before its documents' scripts: Streamlit's websocket is seen

    def _main_thread_s(self) -> float:
        metrics = self.cdp.send("Performance.getMetrics")["metrics"]
        return float(next(m["value"] for m in metrics if m["name"] == "TaskDuration"))

    def measure(self, act: Any, heading: str) -> Sample:
        """Run `act()` (a goto or a click) and wait until `heading`'s page is drawn."""
        browser = _browser_pids()
        fetched = self._fetched()
        url = self.page.url
        act_ms = float(self.page.evaluate("performance.now()"))
        b0, s0, m0 = _cpu_s(browser), _cpu_s(self.server), self._main_thread_s()
        t0 = time.perf_counter()
        act()
        drawn_ms = drawn(self.page, heading)
        wall = time.perf_counter() - t0
        b1, s1, m1 = _cpu_s(_browser_pids()), _cpu_s(self.server), self._main_thread_s()
        n, kb = (a - b for a, b in zip(self._fetched(), fetched, strict=True))
        messages = self.page.evaluate("window.__tsMessages || []")
        before, between, after, ws_kb = split([(float(t), float(b)) for t, b in messages],
                                              0.0 if url == "about:blank" else act_ms, drawn_ms)
        return Sample(wall, b1 - b0, s1 - s0, m1 - m0, int(n), kb, ws_kb, before, between, after)

    def _fetched(self) -> tuple[float, float]:
        """(HTTP requests made by this document so far, KB transferred over the wire: 0 for the cache's)."""
        got = self.page.evaluate("""() => { const e = performance.getEntriesByType('navigation')
            .concat(performance.getEntriesByType('resource'));
            return [e.length, e.reduce((s, r) => s + (r.transferSize || 0), 0) / 1024]; }""")
        return float(got[0]), float(got[1])


def _open(ctx: Any, url: str, path: str, heading: str, server: list[int]) -> Sample:
    """A new tab of `ctx` opening `url/path`: the sample to the page drawn (the tab is closed after)."""
    page = ctx.new_page()
    meter = Meter(page, server)
    got = meter.measure(lambda: page.goto(f"{url}/{path}"), heading)
    page.close()
    return got


def fresh(browser: Any, url: str, path: str, heading: str, server: list[int]) -> Sample:
    """`url/path` in a new browser context (a new Streamlit session, an empty browser cache) to the page drawn."""
    ctx = browser.new_context(viewport=VIEWPORT)
    try:
        return _open(ctx, url, path, heading, server)
    finally:
        ctx.close()


#: One tree's results: (what, samples over the rounds, limit) per measurement, the bare page's first.
Results = list[tuple[str, list[Sample], float]]


def tree_order(round_no: int, trees: list[Path | None]) -> list[Path | None]:
    """The order the trees are measured in, in round `round_no` (from 0): as given in even rounds, reversed in odd
    ones (this, other; other, this; ...), so neither tree is always the first of a pair."""
    return trees if round_no % 2 == 0 else trees[::-1]


def run(store: Path, repeat: int, pages: tuple[tuple[str, str, str], ...] = PAGES, think_s: float = 0.0,
        against: Path | None = None, page_limit_s: float = PAGE_LIMIT_S) -> dict[Path | None, Results]:
    """Drive the browser over `pages` (the first one must be the Overview) and the bare page, each click `think_s`
    after the page before it was drawn, with this tree's dashboard (key None) and, when given, `against`'s: both
    served at once, each measurement taken on both in turn (`tree_order`); each tree's results, each holding the
    same anchor (the bare page's, once a round)."""
    from playwright.sync_api import sync_playwright

    trees: list[Path | None] = [None] if against is None else [None, against]
    rounds: dict[Path | None, dict[str, list[Sample]]] = {t: {} for t in trees}
    limits: dict[str, float] = {}

    def keep(tree: Path | None, label: str, sample: Sample, limit: float = float("inf")) -> None:
        for t in trees if label.startswith(("bare ", "server start to its first answer: bare")) else [tree]:
            rounds[t].setdefault(label, []).append(sample)
        limits[label] = limit

    with tempfile.TemporaryDirectory(prefix="ts-bare-") as bare_dir, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM),
                                    args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        try:
            for round_no in range(repeat):
                with serving(None, Path(bare_dir)) as (url, server, start):  # the anchor, in this round
                    keep(None, "server start to its first answer: bare Streamlit page", start)
                    keep(None, "bare Streamlit page: new profile", fresh(browser, url, "", BARE_HEADING, server))
                    ctx = browser.new_context(viewport=VIEWPORT)
                    _open(ctx, url, "", BARE_HEADING, server)  # its first visit fills the profile's cache
                    keep(None, "bare Streamlit page: new tab", _open(ctx, url, "", BARE_HEADING, server))
                    ctx.close()
                    keep(None, f"bare Streamlit page: its static files, {CONNECTIONS} connections, no browser",
                         fetch_static(url, "", server))
                _dashboard_round(browser, store, tree_order(round_no, trees), pages, think_s, keep, page_limit_s)
        finally:
            browser.close()
    return {t: [(k, v, limits[k]) for k, v in got.items()] for t, got in rounds.items()}


def _dashboard_round(browser: Any, store: Path, trees: list[Path | None], pages: tuple[tuple[str, str, str], ...],
                     think_s: float, keep: Any, page_limit_s: float = PAGE_LIMIT_S) -> None:
    """One round of the dashboard's measurements with a server from each of `trees` (None: this one), all up at
    once; each first render is measured on every tree in turn, in the order given, before the next one (so the two
    samples of a pair are seconds apart, under the same load); the clicks, one session's sequence each, tree after
    tree; each sample handed to `keep` (tree, label, sample[, limit])."""
    with contextlib.ExitStack() as stack:
        served: dict[Path | None, tuple[str, list[int]]] = {}
        for tree in trees:
            url, server, start = stack.enter_context(serving(store, tree=tree))
            served[tree] = url, server
            keep(tree, "server start to its first answer: dashboard (its warm-up done)", start)
        for tree, (url, server) in served.items():
            keep(tree, "first session: Overview, server just up", fresh(browser, url, "", "Overview", server))
        for tree, (url, server) in served.items():
            keep(tree, f"{STATIC_PAGE[1]} page: its static files, {CONNECTIONS} connections, no browser",
                 fetch_static(url, STATIC_PAGE[0], server))
        for _, path, heading in pages:
            for tree, (url, server) in served.items():
                keep(tree, f"fresh session: {heading}", fresh(browser, url, path, heading, server), page_limit_s)
        warm = {}
        for tree, (url, server) in served.items():  # a browser profile per tree whose HTTP cache holds every
            warm[tree] = stack.enter_context(contextlib.closing(browser.new_context(viewport=VIEWPORT)))
            for _, path, heading in pages:  # page's scripts after a first visit, as a user's does
                _open(warm[tree], url, path, heading, server)
        for _, path, heading in pages:
            for tree, (url, server) in served.items():
                keep(tree, f"fresh session, new tab (browser cache warm): {heading}",
                     _open(warm[tree], url, path, heading, server), page_limit_s)
        for tree, (url, server) in served.items():  # one tree's clicks after the other's: a tab left idle between
            page = browser.new_page(viewport=VIEWPORT)  # its clicks would load the other pages' scripts meanwhile
            meter = Meter(page, server)  # (dashboard.preload.later_script), which a click straight after the page
            page.goto(url)  # before does not find; the meter first, to see the session's websocket open
            drawn(page, "Overview")
            for name, _, heading in (*pages[1:], pages[0]):
                page.wait_for_timeout(think_s * 1000)  # the reader's time on the page before
                link = page.get_by_test_id("stSidebarNav").get_by_role("link", name=name, exact=True)
                keep(tree, f"click: {heading}", meter.measure(link.click, heading), CLICK_LIMIT_S)
            page.close()


def main() -> None:
    """Build (or reuse) the demo store, measure (this tree, and --against's), print markdown tables with the
    anchor."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, default=None)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--think", type=float, default=0.0, help="seconds between a page drawn and the next click")
    parser.add_argument("--pages", default="", help="comma-separated sidebar labels (default: every page); the "
                        "Overview is always first")
    parser.add_argument("--materialized", action="store_true",
                        help="materialize the store's stale hours first, as `tailscope collect` does for settled ones "
                        "(benchmarks.bench_dashboard.materialize_store)")
    parser.add_argument("--live-hours", type=int, default=0, metavar="N",
                        help="with --materialized: leave the last N hours live, as collect leaves the current hour "
                        "and the one before")
    parser.add_argument("--page-limit", type=float, default=PAGE_LIMIT_S, metavar="S",
                        help=f"the limit shown beside each first render (default {PAGE_LIMIT_S:g} s, the demo "
                        "store's; a 10 M-span store's is 3 s)")
    parser.add_argument("--against", default=None, metavar="TREE",
                        help="also serve the store from this source tree (a checkout's directory, or a git ref), "
                        "each measurement taken on both in turn")
    args = parser.parse_args()
    wanted = {p.strip() for p in args.pages.split(",") if p.strip()}
    pages = tuple(p for p in PAGES if not wanted or p[0] in wanted or p[0] == "Overview")
    if not CHROMIUM.exists():
        sys.exit("needs Debian's chromium: make browser-deps")
    tmp = None
    store = args.store
    if store is None:
        tmp = Path(tempfile.mkdtemp(prefix="tailscope-bench-browser-"))
        store = tmp / "store"
    if not store.exists():  # the demo store, as `tailscope demo` writes it
        exe = Path(sys.executable).parent / "tailscope"
        subprocess.run([str(exe), "demo", "--store", str(store)], check=True, capture_output=True, timeout=600)
    if args.materialized:
        from benchmarks.bench_dashboard import materialize_store

        t0 = time.perf_counter()
        written, live = materialize_store(store, max(0, args.live_hours))
        print(f"materialized {written} hour(s) in {time.perf_counter() - t0:.1f} s; live: {live} hour(s)",
              file=sys.stderr)
    repeat = max(1, args.repeat)
    try:
        with other_tree(args.against) if args.against else contextlib.nullcontext() as against:
            results = run(store, repeat, pages, max(0.0, args.think), against, args.page_limit)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end, {os.cpu_count()} cores; medians of {repeat} round(s)")
    if args.against is None:
        print("\n".join(table(results[None])))
        return
    print(f"\nthis tree ({ROOT.name}):")
    print("\n".join(table(results[None])))
    print(f"\nthe other tree (--against {args.against}):")
    print("\n".join(table(results[against])))
    print(f"\nthis tree / the other (--against {args.against}), medians, {repeat} alternated round(s):")
    print("\n".join(versus(results[None], results[against])))


def medians(results: Results) -> dict[str, Sample]:
    """Each measurement's median sample (field by field) over its rounds."""
    return {label: Sample(*(statistics.median(getattr(s, f) for s in samples) for f in Sample.__dataclass_fields__))
            for label, samples, _ in results}


def table(results: Results) -> list[str]:
    """The markdown table: each measurement's medians, its ratio to the bare page in the same mode (a new tab and
    a click against the bare page's new tab, the server's start against the bare page's server's, the static files
    against the bare page's, the others against its new profile), the limit."""
    med = medians(results)
    bare_profile, bare_tab = med["bare Streamlit page: new profile"], med["bare Streamlit page: new tab"]
    bare_static = med[f"bare Streamlit page: its static files, {CONNECTIONS} connections, no browser"]
    out = [f"anchor (a bare Streamlit page, same browser and flags): new profile {bare_profile.wall_s:.2f} s, "
           f"new tab {bare_tab.wall_s:.2f} s", "",
           "| measurement | seconds | × bare page | browser CPU-s | main thread s | server CPU-s | requests "
           "| KB fetched | websocket KB | s to 1st message | s 1st to last message | s after last message | limit |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for label, _, limit in results:
        m = med[label]
        base = (bare_tab if "new tab" in label or label.startswith("click") else
                med["server start to its first answer: bare Streamlit page"] if label.startswith("server start")
                else bare_static if "static files" in label else bare_profile)
        out.append(f"| {label} | {m.wall_s:.2f} | {m.wall_s / base.wall_s:.1f} | {m.browser_cpu_s:.2f} | "
                   f"{m.main_thread_s:.2f} | {m.server_cpu_s:.2f} | {m.requests:.0f} | {m.kbytes:,.0f} | "
                   f"{m.ws_kbytes:,.0f} | {m.to_first_message_s:.2f} | {m.first_to_last_message_s:.2f} | "
                   f"{m.after_last_message_s:.2f} | {'–' if limit == float('inf') else f'<= {limit:g} s'} |")
    return out


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b > 0 else "–"


def versus(this: Results, other: Results) -> list[str]:
    """The markdown table of this tree's medians against the other's, measurement by measurement (the anchor's
    rows are the same samples in both, so left out): seconds, browser and server CPU-s, KB fetched, and the
    ratios this / other."""
    a, b = medians(this), medians(other)
    out = ["| measurement | seconds this / other | × | browser CPU-s this / other | × | server CPU-s this / other "
           "| × | KB fetched this / other | websocket KB this / other |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for label, _, _ in this:
        if label in b and "bare Streamlit page" not in label:
            x, y = a[label], b[label]
            out.append(f"| {label} | {x.wall_s:.2f} / {y.wall_s:.2f} | {_ratio(x.wall_s, y.wall_s)} | "
                       f"{x.browser_cpu_s:.2f} / {y.browser_cpu_s:.2f} | {_ratio(x.browser_cpu_s, y.browser_cpu_s)} | "
                       f"{x.server_cpu_s:.2f} / {y.server_cpu_s:.2f} | {_ratio(x.server_cpu_s, y.server_cpu_s)} | "
                       f"{x.kbytes:,.0f} / {y.kbytes:,.0f} | {x.ws_kbytes:,.0f} / {y.ws_kbytes:,.0f} |")
    return out


if __name__ == "__main__":
    exit_on_termination()
    main()
