"""Dashboard benchmark in the real browser: each page's first render in a fresh session, and page clicks.

Starts `tailscope dashboard` on the demo store (`tailscope demo`'s, built in a temp directory unless
--store) on a loopback port, and drives Debian's chromium with Playwright:

1. the first session's Overview right after the server is up (the store opens, its caches fill);
2. every page once, each in a new browser context (a fresh Streamlit session, the server's caches warm,
   the browser's cache empty: a new browser profile downloads and compiles the app's scripts);
3. every page once, each in a new tab of one browser profile (a fresh Streamlit session; the browser's
   HTTP cache holds the app's scripts, as a user's browser does after a first visit);
4. every page again, one sidebar click after another in one session (a click to the page drawn).

A page counts as drawn when Streamlit's status widget says nothing runs, its heading is visible, and
every chart of it has drawn. The anchor, in the same run: a DuckDB scan of the store's spans (p50/p99
per span name), in this process.

    python -m benchmarks.bench_dashboard_browser [--store DIR] [--repeat 3] [--pages Overview,Spike,...]

Without --store, or with one that does not exist yet, it writes the demo store first (there, or in a
temp directory removed afterwards).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
#: (sidebar label, URL path, heading)
PAGES: tuple[tuple[str, str, str], ...] = (
    ("Overview", "", "Overview"), ("Spike", "spike", "Spike"), ("Alerts", "alerts", "Alerts"),
    ("Traces", "traces", "Traces"), ("Request shape", "shape", "Request shape"),
    ("Replicas", "replicas", "Replicas"), ("What-if", "whatif", "What-if"), ("Capacity", "capacity", "Capacity"),
    ("Cost", "cost", "Cost"), ("SQL", "sql", "SQL"),
)
PAGE_LIMIT_S = 1.5
CLICK_LIMIT_S = 0.5


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serving(store: Path) -> Iterator[str]:
    """`tailscope dashboard --store STORE` on a free loopback port; stopped (its process group) at the end."""
    import httpx

    port = _free_port()
    exe = Path(sys.executable).parent / "tailscope"
    proc = subprocess.Popen([str(exe), "dashboard", "--store", str(store), "--host", "127.0.0.1", "--port",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):  # bounded: about a minute
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/_stcore/health", timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        else:
            raise RuntimeError("the dashboard did not start")
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def drawn(page: Any, heading: str) -> None:
    """Wait until the page's script has finished and its heading and charts are on screen."""
    page.get_by_role("heading", name=heading, exact=True).first.wait_for(state="visible")
    page.wait_for_function("""() => {
        const w = document.querySelector('[data-testid=stStatusWidget]');
        if (w && /Running|Stop/.test(w.innerText)) return false;
        if (document.querySelector('[data-testid=stSkeleton]')) return false;
        const charts = [...document.querySelectorAll('[data-testid=stVegaLiteChart]')];
        return charts.every(c => c.querySelector('svg, canvas'));
    }""", polling=50, timeout=120_000)


def fresh(browser: Any, url: str, path: str, heading: str) -> float:
    """Seconds from opening `url/path` in a new browser context (a new Streamlit session) to the page drawn."""
    ctx = browser.new_context(viewport={"width": 1440, "height": 1000})
    page = ctx.new_page()
    t0 = time.perf_counter()
    page.goto(f"{url}/{path}")
    drawn(page, heading)
    took = time.perf_counter() - t0
    ctx.close()
    return took


def anchor(store: Path) -> float:
    """Seconds of the anchor query: p50/p99 of span durations per span name over the store's spans."""
    from analysis.engine.connect import connect

    con = connect(store)
    t0 = time.perf_counter()
    con.execute("SELECT SpanName, quantile_cont(Duration, 0.5), quantile_cont(Duration, 0.99) "
                "FROM spans GROUP BY 1").fetchall()
    took = time.perf_counter() - t0
    con.close()
    return took


def run(store: Path, repeat: int, pages: tuple[tuple[str, str, str], ...] = PAGES) -> list[tuple[str, float, float]]:
    """Drive the browser over `pages` (the first one must be the Overview); (what, median seconds over `repeat`
    rounds, limit) per measurement."""
    from playwright.sync_api import sync_playwright

    rounds: dict[str, list[float]] = {}
    limits: dict[str, float] = {}
    for _ in range(repeat):
        with serving(store) as url, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM),
                                        args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
            try:
                rounds.setdefault("first session: Overview, server just up", []).append(
                    fresh(browser, url, "", "Overview"))
                limits["first session: Overview, server just up"] = float("inf")
                for _, path, heading in pages:
                    label = f"fresh session: {heading}"
                    rounds.setdefault(label, []).append(fresh(browser, url, path, heading))
                    limits[label] = PAGE_LIMIT_S
                warm = browser.new_context(viewport={"width": 1440, "height": 1000})  # one browser profile:
                tab = warm.new_page()  # its HTTP cache holds the app's scripts after a first visit, as a user's does
                tab.goto(url)
                drawn(tab, "Overview")
                tab.close()
                for _, path, heading in pages:
                    label = f"fresh session, new tab (browser cache warm): {heading}"
                    tab = warm.new_page()
                    t0 = time.perf_counter()
                    tab.goto(f"{url}/{path}")
                    drawn(tab, heading)
                    rounds.setdefault(label, []).append(time.perf_counter() - t0)
                    limits[label] = PAGE_LIMIT_S
                    tab.close()
                warm.close()
                page = browser.new_page(viewport={"width": 1440, "height": 1000})
                page.goto(url)
                drawn(page, "Overview")
                for name, _, heading in (*pages[1:], pages[0]):
                    t0 = time.perf_counter()
                    page.get_by_test_id("stSidebarNav").get_by_role("link", name=name, exact=True).click()
                    drawn(page, heading)
                    label = f"click: {heading}"
                    rounds.setdefault(label, []).append(time.perf_counter() - t0)
                    limits[label] = CLICK_LIMIT_S
            finally:
                browser.close()
    return [(k, statistics.median(v), limits[k]) for k, v in rounds.items()]


def main() -> None:
    """Build (or reuse) the demo store, measure, print a markdown table with the anchor."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, default=None)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pages", default="", help="comma-separated sidebar labels (default: every page); the "
                        "Overview is always first")
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
    try:
        base = anchor(store)
        results = run(store, max(1, args.repeat), pages)
        base = min(base, anchor(store))
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"anchor (spans scan, p50/p99 per span name): {base:.3f} s; load average {os.getloadavg()[0]:.1f}")
    print("\n| measurement | seconds (median) | × anchor | limit |\n|---|---:|---:|---:|")
    for label, took, limit in results:
        print(f"| {label} | {took:.2f} | {took / base:.0f} | {'–' if limit == float('inf') else f'<= {limit:g} s'} |")


if __name__ == "__main__":
    main()
