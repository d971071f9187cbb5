"""Browser test: `tailscope dashboard` on loopback, driven by Playwright in Debian's headless Chromium.

Clicks through every page, checks the spike and its top replica are on screen, and saves a
screenshot of each page in test-artifacts/. `make test` installs chromium first
(`make browser-deps`); no browser is downloaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.needs import need

pytestmark = pytest.mark.slow  # an end-to-end run (CONTRIBUTING.md: make test-fast leaves it out)

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).parents[2] / "test-artifacts"
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--no-first-run"]
#: (navigation label, page heading, text that must be on screen)
PAGES: tuple[tuple[str, str, str], ...] = (
    ("Overview", "Overview", "Spike 07:18:00"),
    ("Spike", "Spike", "replica-05"),
    ("Traces", "Traces", "Slowest requests"),
    ("Request shape", "Request shape", "Slowest cell with a p99 to trust"),
    ("Replicas", "Replicas", "replica-05"),
    ("What-if", "What-if", "predicted, 8 replicas"),
    ("SQL", "SQL", "Examples"),
)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _serving(args: list[str], log_name: str) -> Iterator[str]:
    """`tailscope dashboard ARGS` on a free loopback port until the block ends; then SIGTERM, checked to stop it."""
    port = _free_port()
    exe = Path(sys.executable).parent / "tailscope"
    log = ARTIFACTS / log_name
    ARTIFACTS.mkdir(exist_ok=True)
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(exe), "dashboard", *args, "--host", "127.0.0.1", "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(600):  # bounded: about a minute
                if proc.poll() is not None:
                    pytest.fail(f"tailscope dashboard exited with {proc.returncode}: {log.read_text()[-2000:]}")
                try:
                    if httpx.get(f"{url}/_stcore/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            else:
                pytest.fail(f"the dashboard did not answer on {url}: {log.read_text()[-2000:]}")
            yield url
        finally:
            proc.terminate()  # SIGTERM to `tailscope dashboard` only: it must stop its Streamlit child
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            stopped = False
            for _ in range(100):  # bounded
                try:
                    httpx.get(f"{url}/_stcore/health", timeout=1)
                except httpx.HTTPError:
                    stopped = True
                    break
                time.sleep(0.1)
            if not stopped:
                os.killpg(proc.pid, signal.SIGKILL)
                pytest.fail("the Streamlit server outlived `tailscope dashboard` after SIGTERM")


@pytest.fixture(scope="module")
def dashboard_url(incident_store: Path) -> Iterator[str]:
    """`tailscope dashboard` serving the incident store on a free loopback port."""
    with _serving(["--store", str(incident_store)], "dashboard-server.log") as url:
        yield url


def _visit_pages(browser: Any, url: str, pages: Sequence[tuple[str, str, str]], shots: str) -> Any:
    """Open `url`, click each (link, heading, text that must show) in the sidebar, screenshot each page as
    `<shots>-<heading>.png` and fail on a traceback; returns the page, still open."""
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(90_000)
    expect.set_options(timeout=90_000)  # expect() has its own 5 s default: too short on a loaded machine
    page.goto(url, wait_until="networkidle")
    for label, heading, must_show in pages:
        page.get_by_test_id("stSidebarNav").get_by_role("link", name=label, exact=True).click()
        expect(page.get_by_role("heading", name=heading, exact=True).first).to_be_visible()
        expect(page.get_by_text(must_show).first).to_be_visible()
        _settle(page)
        _screenshot(page, ARTIFACTS / f"{shots}-{heading.lower().replace(' ', '-')}.png")
        assert page.get_by_test_id("stException").count() == 0, f"{label}: a traceback is on screen"
    return page


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Debian chromium for every browser test of the module (each opens its own page)."""
    need(CHROMIUM.exists(), "Debian's chromium", "run `make browser-deps`")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def test_click_through_every_page(dashboard_url: str, browser: Any) -> None:
    from playwright.sync_api import expect

    page = _visit_pages(browser, dashboard_url, PAGES, "dashboard")
    # the spike page names the top replica with its counterfactual p99
    page.get_by_test_id("stSidebarNav").get_by_role("link", name="Spike", exact=True).click()
    lead = page.get_by_test_id("stAlertContentSuccess").first
    expect(lead).to_contain_text("replica = replica-05")
    expect(lead).to_contain_text("instead of")
    # brushing a window on the chart selects it for explanation
    _settle(page)
    box = page.get_by_test_id("stVegaLiteChart").first.bounding_box()
    assert box is not None
    y = box["y"] + box["height"] * 0.45
    page.mouse.move(box["x"] + box["width"] * 0.25, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.45, y, steps=8)
    page.mouse.up()
    expect(page.get_by_role("combobox", name="Window")).to_have_value(re.compile(r"^brushed \d\d:\d\d"))
    _settle(page)
    _screenshot(page, ARTIFACTS / "dashboard-spike-brushed.png")
    assert page.get_by_test_id("stException").count() == 0
    page.close()


def _settle(page: object) -> None:
    """Wait until Streamlit has finished running the script (its status widget is gone)."""
    from playwright.sync_api import Page

    assert isinstance(page, Page)
    page.wait_for_load_state("networkidle")
    running = page.get_by_test_id("stStatusWidget").get_by_text("Stop")
    for _ in range(600):  # bounded
        if running.count() == 0:
            break
        page.wait_for_timeout(100)
    page.wait_for_timeout(700)  # let Vega finish drawing the charts


def _screenshot(page: object, path: Path) -> None:
    """The whole page: Streamlit scrolls inside its main block, so grow the viewport to its height first."""
    from playwright.sync_api import Page

    assert isinstance(page, Page)
    size = page.viewport_size or {"width": 1400, "height": 1000}
    height = page.evaluate("() => document.querySelector('[data-testid=stMain]')?.scrollHeight ?? 1000")
    page.set_viewport_size({"width": size["width"], "height": max(size["height"], min(int(height), 6000))})
    _settle(page)
    page.screenshot(path=str(path))
    page.set_viewport_size(size)


SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "data" / "incidents" / "slow_replica.otlp.jsonl.gz"


@pytest.fixture(scope="module")
def clickhouse_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, Any]]]:
    """`tailscope dashboard --engine clickhouse` on a chdb table filled from a catalogue sample, and the
    `report --engine clickhouse --json` of that table. Each step is its own process: chdb opens a
    directory in one process at a time, and the test process never opens it."""
    root = tmp_path_factory.mktemp("chbrowser")
    exe = str(Path(sys.executable).parent / "tailscope")
    dsn = f"chdb:{root / 'ch'}"
    for args in (["ingest", str(SAMPLE), "--store", str(root / "store")],
                 ["export", "--to", "clickhouse", "--dsn", dsn, "--store", str(root / "store"), "--quiet"]):
        subprocess.run([exe, *args], check=True, capture_output=True, timeout=600)
    done = subprocess.run([exe, "report", "--engine", "clickhouse", "--dsn", dsn, "--json"], check=True,
                          capture_output=True, text=True, timeout=600)
    with _serving(["--engine", "clickhouse", "--dsn", dsn], "dashboard-clickhouse-server.log") as url:
        yield url, json.loads(done.stdout)


def test_the_dashboard_on_clickhouse(clickhouse_url: tuple[str, dict[str, Any]], browser: Any) -> None:
    """The Overview shades the report's spike; Spike, Request shape, Replicas, What-if, Traces and SQL run; a
    store-only page says so."""
    url, report = clickhouse_url
    assert report["spikes"], "the slow_replica sample has a spike"
    spike = report["spikes"][0]
    start, end = (f"{datetime.fromisoformat(spike[k].replace('Z', '+00:00')):%H:%M:%S}" for k in ("start", "end"))
    lead = spike["dimensions"][0]
    pages = (("Overview", "Overview", f"Spike {start}–{end} UTC"),
             ("Spike", "Spike", f"{lead['dimension']} = {lead['value']}"),
             ("Traces", "Traces", "Slowest requests"),
             ("SQL", "SQL", "readonly = 1"),
             ("Replicas", "Replicas", "p99 (red: outlier"),
             ("What-if", "What-if", "predicted,"),
             ("Cost", "Cost", "GPU-hours allocated"),
             ("Alerts", "Alerts", "The Alerts page does not run on ClickHouse yet"))
    _visit_pages(browser, url, pages, "dashboard-clickhouse").close()
