"""Browser test: `tailscope dashboard` on loopback, driven by Playwright in Debian's headless Chromium.

Clicks through every page, checks the spike and its top replica are on screen, and saves a
screenshot of each page in test-artifacts/. `make test` installs chromium first
(`make browser-deps`); no browser is downloaded. One chromium serves the module's tests (each
opens its own pages), and a page counts as drawn when the benchmark's test says so
(`benchmarks.bench_dashboard_browser.settled`: no script running, every shown chart and table drawn).
"""

from __future__ import annotations

import contextlib
import json
import re
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

from benchmarks.bench_dashboard_browser import settled
from tests import samples_cache, servers
from tests.needs import need

pytestmark = pytest.mark.slow  # an end-to-end run (CONTRIBUTING.md: make test-fast leaves it out)

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).parents[2] / "test-artifacts"
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--no-first-run"]
#: (navigation label, page heading, text(s) that must be on screen): every page, each visited once; What-if and
#: Capacity (and its scale-up comparison) state the replay's assumption about service time in their headlines
PAGES: tuple[tuple[str, str, str | tuple[str, ...]], ...] = (
    ("Overview", "Overview", "Spike 07:18:00"),
    ("Spike", "Spike", "replica-05"),
    ("Alerts", "Alerts", "No alert in this range"),
    ("Traces", "Traces", "Slowest requests"),
    ("Request shape", "Request shape", "Slowest cell with a p99 to trust"),
    ("Replicas", "Replicas", "replica-05"),
    ("What-if", "What-if", ("predicted, 8 replicas", "If service")),
    ("Capacity", "Capacity", ("If service", "reactive scale-up from")),
    ("Cost", "Cost", "set a price (docs/cost.md)"),
    ("SQL", "SQL", "Examples"),
)
#: What no page may show outside its tables: None, nan, or a float with more than 3 decimals.
RAW = re.compile(r"(?<![\w.])(None|nan|NaN)(?![\w.])|\d\.\d{4,}")
#: A browser far from UTC: every time on screen must still read UTC.
BROWSER_ZONE = "America/New_York"


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
        proc = servers.spawn([str(exe), "dashboard", *args, "--host", "127.0.0.1", "--port", str(port)],
                             stdout=out, stderr=subprocess.STDOUT)
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
            stopped = False
            try:
                proc.terminate()  # SIGTERM to `tailscope dashboard` only: it must stop its Streamlit child
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=30)
                for _ in range(100):  # bounded
                    try:
                        httpx.get(f"{url}/_stcore/health", timeout=1)
                    except httpx.HTTPError:
                        stopped = True
                        break
                    time.sleep(0.1)
            finally:
                servers.stop(proc)  # the whole group, whatever happened above (an interrupt included)
            if not stopped:
                pytest.fail("the Streamlit server outlived `tailscope dashboard` after SIGTERM")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's chromium under Playwright, launched once for the module's tests."""
    need(CHROMIUM.exists(), "Debian's chromium", "run `make browser-deps`")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def context(browser: Any) -> Iterator[Any]:
    """A browser context of its own for one test (its pages, cookies and cache; closed after it), in New York."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000}, timezone_id=BROWSER_ZONE)
    try:
        yield ctx
    finally:
        ctx.close()


@pytest.fixture(scope="module")
def dashboard_url(incident_store: Path) -> Iterator[str]:
    """`tailscope dashboard` serving the incident store on a free loopback port."""
    with _serving(["--store", str(incident_store)], "dashboard-server.log") as url:
        yield url


def _new_page(context: Any) -> Any:
    """A new tab of `context` whose waits (and expect()'s) allow 90 s: a loaded machine is slow."""
    from playwright.sync_api import expect

    page = context.new_page()
    page.set_default_timeout(90_000)
    expect.set_options(timeout=90_000)  # expect() has its own 5 s default: too short on a loaded machine
    return page


#: A narrow laptop's viewport: every page is checked at it too (nothing cut short), beside the default 1,400 px.
NARROW = {"width": 1024, "height": 1000}


def _visit_pages(context: Any, url: str, pages: Sequence[tuple[str, str, str | tuple[str, ...]]], shots: str,
                 asked: list[str] | None = None, narrow: bool = False) -> Any:
    """Open `url`, click each (link, heading, text that must show) in the sidebar, screenshot each page as
    `<shots>-<heading>.png` and fail on a traceback; `narrow`: each page again at NARROW's width, nothing cut short
    (`<shots>-<heading>-1024.png`). Returns the page, still open."""
    from playwright.sync_api import expect

    page = _new_page(context)
    if asked is not None:
        page.on("request", lambda r: asked.append(r.url))
    page.goto(url, wait_until="networkidle")
    for label, heading, must_show in pages:
        page.get_by_test_id("stSidebarNav").get_by_role("link", name=label, exact=True).click()
        expect(page.get_by_role("heading", name=heading, exact=True).first).to_be_visible()
        for text in must_show if isinstance(must_show, tuple) else (must_show,):
            expect(page.get_by_text(text).first).to_be_visible()
        _settle(page)
        _screenshot(page, ARTIFACTS / f"{shots}-{heading.lower().replace(' ', '-')}.png")
        assert page.get_by_test_id("stException").count() == 0, f"{label}: a traceback is on screen"
        assert not RAW.search(_text_outside_tables(page)), f"{label}: {RAW.findall(_text_outside_tables(page))}"
        assert not _misdrawn(page), f"{label}: misdrawn: {_misdrawn(page)}"
        if narrow:
            wide = page.viewport_size
            page.set_viewport_size(NARROW)
            _settle(page)
            _screenshot(page, ARTIFACTS / f"{shots}-{heading.lower().replace(' ', '-')}-1024.png")
            assert not _misdrawn(page), f"{label} at 1,024 px: misdrawn: {_misdrawn(page)}"
            page.set_viewport_size(wide)
    return page


def _misdrawn(page: Any) -> list[Any]:
    """The metric values and labels too wide for their place (the browser ends them with an ellipsis), the tables
    that run past the page's right edge, the chart texts Vega shortened (a legend's or an axis' label past its limit
    ends with "…") and each axis that repeats a label (a count axis ticking halves rounds 0.5 to a second "1"; a log
    axis leaves some ticks blank)."""
    return list(page.evaluate("""() => [
        ...[...document.querySelectorAll('[data-testid=stMain] table')].filter(t => {
            const box = document.querySelector('[data-testid=stMainBlockContainer]');
            const right = box.getBoundingClientRect().right - parseFloat(getComputedStyle(box).paddingRight);
            return t.getBoundingClientRect().right > right + 1; }).map(t => 'table: ' + t.innerText.slice(0, 40)),
        ...[...document.querySelectorAll('[data-testid=stMetricValue] *, [data-testid=stMetricLabel] *')]
            .filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.innerText),
        ...[...document.querySelectorAll('[data-testid=stVegaLiteChart] svg text')].map(t => t.textContent)
            .filter(t => t.endsWith('\u2026')),
        ...[...document.querySelectorAll('[data-testid=stVegaLiteChart] .role-axis')]
            .map(a => [...a.querySelectorAll('.role-axis-label text')].map(t => t.textContent).filter(t => t))
            .filter(labels => new Set(labels).size < labels.length)]"""))


def _text_outside_tables(page: Any) -> str:
    """The main block's text without its grid tables (a grid's formats are checked by tests/dashboard/test_pages.py:
    it draws on a canvas, and its hidden accessibility copy holds the raw values). A static table's cells stay, each
    followed by a space: a detached copy's text runs cells together ("597.8" "476.3" would read "597.8476.3")."""
    return str(page.evaluate("""() => { const m = document.querySelector('[data-testid=stMain]').cloneNode(true);
        m.querySelectorAll('[data-testid=stDataFrame], [data-testid=stCode], textarea').forEach(e => e.remove());
        m.querySelectorAll('td, th').forEach(c => c.append(' '));
        return m.innerText; }"""))


def test_click_through_every_page(context: Any, dashboard_url: str) -> None:
    """Every page once in a New York browser, at 1,400 and 1,024 px: no traceback, no raw number, nothing cut
    short, nothing fetched from off the machine;
    the time axes read UTC like the banners; the failures chart draws visible bars; a latency tab draws its chart;
    a brush explains a window."""
    from playwright.sync_api import expect

    asked: list[str] = []
    page = _visit_pages(context, dashboard_url, PAGES, "dashboard", asked, narrow=True)
    outside = sorted({u for u in asked if not u.startswith((dashboard_url, "data:", "blob:"))})
    assert not outside, f"requests leaving the machine: {outside}"
    # no page makes Streamlit's Markdown load its raw-HTML support (Markdown with unsafe_allow_html: about 190 KB) or
    # its emoji plugin (text reading like a shortcode, `:06:` in a clock time: about 260 KB) (docs/dashboard.md)
    plugins = sorted({u.rsplit("/", 1)[-1] for u in asked if re.search(r"/(rehype-raw|remark-emoji)\.[^/]*\.js$", u)})
    assert not plugins, f"Markdown plugins loaded: {plugins}"
    page.get_by_test_id("stSidebarNav").get_by_role("link", name="Overview", exact=True).click()
    expect(page.get_by_role("heading", name="Overview", exact=True).first).to_be_visible()
    _settle(page)
    # one clock: the x axes of a New York browser read the banner's UTC times (07:xx), 24-hour
    ticks = page.locator("[data-testid=stVegaLiteChart] .role-axis-label text").all_text_contents()
    times = [t for t in ticks if re.fullmatch(r"\d\d:\d\d", t)]
    assert times and {t[:2] for t in times} <= {"07"}, times
    # the failed requests' chart draws each window's bar its full width
    bars = page.locator('[data-testid=stVegaLiteChart] path[aria-label*="outcome: error"]')
    expect(bars.first).to_be_attached()  # Vega draws after the script has finished: wait for it
    assert min(b["width"] for b in (bars.nth(i).bounding_box() for i in range(bars.count())) if b) > 3
    # the percentile chart's time axis runs where the count charts' axes run: the same range (the axis' own words),
    # the same pixels (its labels' extent)
    x_axes = "[data-testid=stVegaLiteChart] .role-axis[aria-label^='X-axis']"
    axes = page.evaluate(f'() => [...document.querySelectorAll("{x_axes}")].map(d => {{ '
                         'const r = d.getBoundingClientRect(); '
                         'return [d.getAttribute("aria-label"), r.left, r.right]; })')
    assert len(axes) == 3 and all(x[0] == axes[0][0] and abs(x[1] - axes[0][1]) <= 1 and abs(x[2] - axes[0][2]) <= 1
                                  for x in axes[1:]), axes
    # the latency tabs draw the open tab's chart only: picking TTFT puts TTFT's percentiles first
    page.get_by_role("tab", name="TTFT", exact=True).click()
    expect(page.locator("[data-testid=stVegaLiteChart] .role-title-text text").first).to_have_text("TTFT")
    # the spike banner is a link to its window on the Spike page
    link = page.get_by_role("link", name="Open it on the Spike page").first
    assert re.fullmatch(r"spike\?start_ns=\d+&end_ns=\d+", link.get_attribute("href") or "")
    # the spike page names the top replica with its counterfactual p99 and the baseline beside it
    page.get_by_test_id("stSidebarNav").get_by_role("link", name="Spike", exact=True).click()
    lead = page.get_by_test_id("stAlertContentSuccess").first
    expect(lead).to_contain_text("replica = replica-05")
    expect(lead).to_contain_text("baseline without it")
    # brushing a window on the chart selects it for explanation, and puts it in the URL
    _settle(page)
    # the counterfactual bars (one per candidate, beside its label) are tall enough to read: 16 px or more
    bars = "[data-testid=stVegaLiteChart] path[aria-label*='p99 without (ms)']"
    tall = page.evaluate(f'() => [...document.querySelectorAll("{bars}")].map(p => p.getBoundingClientRect().height)')
    assert tall and min(tall) >= 16, tall
    box = page.get_by_test_id("stVegaLiteChart").first.bounding_box()
    assert box is not None
    y = box["y"] + box["height"] * 0.45
    page.mouse.move(box["x"] + box["width"] * 0.25, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.45, y, steps=8)
    page.mouse.up()
    expect(page.get_by_role("radio", name=re.compile(r"^brushed \d\d:\d\d:\d\d–"))).to_be_checked()
    _settle(page)
    _screenshot(page, ARTIFACTS / "dashboard-spike-brushed.png")
    assert page.get_by_test_id("stException").count() == 0
    assert re.search(r"start_ns=\d+000000000&end_ns=\d+000000000(&|$)", page.url), page.url  # whole seconds


def test_links_open_the_view_they_name(context: Any, dashboard_url: str) -> None:
    """A shared link opens its filters (a filter too narrow to judge says so), and a trace link its waterfall."""
    from playwright.sync_api import expect

    page = _new_page(context)
    page.goto(f"{dashboard_url}/?replica=replica-05", wait_until="networkidle")
    expect(page.get_by_text("Spike detection could not judge these filters").first).to_be_visible()
    _settle(page)
    _screenshot(page, ARTIFACTS / "dashboard-link-filtered-overview.png")
    metrics = page.get_by_test_id("stMetric").all_inner_texts()
    assert any(re.fullmatch(r"spikes\s+\?", m) for m in metrics), metrics  # no count: not "0", not cut short
    assert not _misdrawn(page), _misdrawn(page)
    # an attribute filter's link turns the sidebar's attribute filter on with that key and value: the line under
    # the closed filters popover says so, and the popover, once opened, holds the filter's widgets
    page.goto(f"{dashboard_url}/?attr=gen_ai.request.stream&attr_value=true", wait_until="networkidle")
    sidebar = page.get_by_test_id("stSidebar")
    expect(sidebar.get_by_text("gen_ai.request.stream = true").first).to_be_visible()
    _settle(page)
    assert page.get_by_test_id("stMultiSelect").count() == 0  # a closed popover mounts none of its widgets
    sidebar.get_by_role("button", name="Filters").click()
    filters = page.get_by_test_id("stPopoverBody")
    expect(filters.get_by_text("gen_ai.request.stream =").first).to_be_visible()
    expect(filters.get_by_test_id("stMultiSelect").last.get_by_text("true", exact=True)).to_be_visible()
    _settle(page)
    _screenshot(page, ARTIFACTS / "dashboard-link-attribute.png")
    assert "attr=gen_ai.request.stream" in page.url and "attr_value=true" in page.url
    # the several-filter form (`attr.<key>=`) opens the same view; one filter is written back in the first form
    page.goto(f"{dashboard_url}/?attr.gen_ai.request.stream=true", wait_until="networkidle")
    expect(sidebar.get_by_text("gen_ai.request.stream =").first).to_be_visible()
    _settle(page)
    assert "attr=gen_ai.request.stream" in page.url and "attr.gen_ai" not in page.url
    page.goto(f"{dashboard_url}/traces?trace=7a11000000000000", wait_until="networkidle")
    heading = page.get_by_role("heading", name=re.compile(r"^Trace 7a11000000000000")).first
    expect(heading).to_be_visible()
    _settle(page)
    slowest = page.get_by_role("heading", name="Slowest requests (exemplars of the tail)").first
    assert heading.bounding_box()["y"] < slowest.bounding_box()["y"]


def test_each_pages_html_names_the_scripts_it_draws_with(dashboard_url: str) -> None:
    """The server's HTML for a page's URL names that page's element scripts (dashboard.preload), each served by the
    server itself; a static file passes untouched."""
    from dashboard.preload import page_heads, static_dir

    html = {}
    for path in ("", "spike", "traces"):
        html[path] = httpx.get(f"{dashboard_url}/{path}", timeout=60).text
        assert page_heads()[path].decode() in html[path]
    radio = r'href="\./(static/js/Radio\.[^"]+\.js)"'
    named = re.findall(radio, html["spike"])  # the Spike page's window chooser
    assert len(named) == 1
    # the Spike and Traces pages' tables are Markdown (dashboard.formats.table): their HTML names the grid's script
    # only in the script that loads it once the page is drawn and quiet (preload.later_script), for a first click to
    # a page that draws one
    for path in ("spike", "traces"):
        head, later = html[path].split("<script>addEventListener")
        assert not re.search(r"DataFrame\.", head) and re.search(r"\./static/js/DataFrame\.[^\"]+\.js", later)
    assert httpx.get(f"{dashboard_url}/{named[0]}", timeout=60).content == (static_dir() / named[0]).read_bytes()


def _settle(page: object) -> None:
    """Wait until Streamlit has finished running the script and every shown chart and table is drawn."""
    from playwright.sync_api import Page

    assert isinstance(page, Page)
    page.wait_for_load_state("networkidle")
    settled(page)


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
    """`tailscope dashboard --engine clickhouse` on a chdb table filled from a catalogue sample (its store as
    `tailscope ingest` leaves it, shared with the other tests that read it: tests/samples_cache.py), and the
    `report --engine clickhouse --json` of that table. Each step is its own process: chdb opens a
    directory in one process at a time, and the test process never opens it."""
    root = tmp_path_factory.mktemp("chbrowser")
    exe = str(Path(sys.executable).parent / "tailscope")
    dsn = f"chdb:{root / 'ch'}"
    store = samples_cache.store(SAMPLE, tmp_path_factory, cli=True)
    subprocess.run([exe, "export", "--to", "clickhouse", "--dsn", dsn, "--store", str(store), "--quiet"], check=True,
                   capture_output=True, timeout=600)
    done = subprocess.run([exe, "report", "--engine", "clickhouse", "--dsn", dsn, "--json"], check=True,
                          capture_output=True, text=True, timeout=600)
    with _serving(["--engine", "clickhouse", "--dsn", dsn], "dashboard-clickhouse-server.log") as url:
        yield url, json.loads(done.stdout)


def test_the_dashboard_on_clickhouse(context: Any, clickhouse_url: tuple[str, dict[str, Any]]) -> None:
    """The Overview shades the report's spike; Spike, Request shape, Replicas, What-if, Traces and SQL run; a
    store-only page says so."""
    from playwright.sync_api import expect

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
             ("Alerts", "Alerts", "The Alerts page does not run on this engine yet"))
    page = _visit_pages(context, url, pages, "dashboard-clickhouse")
    # a link with two attribute filters turns the table's attribute filter on with both, and keeps them
    page.goto(f"{url}/replicas?attr.k8s.node.name=us-east-1a-node-0&attr.gen_ai.request.stream=true",
              wait_until="networkidle")
    sidebar = page.get_by_test_id("stSidebar")
    for shown in ("k8s.node.name =", "gen_ai.request.stream =", "us-east-1a-node-0"):
        expect(sidebar.get_by_text(shown).first).to_be_visible()
    _settle(page)
    _screenshot(page, ARTIFACTS / "dashboard-clickhouse-link-attributes.png")
    assert page.get_by_test_id("stException").count() == 0
    assert "attr.k8s.node.name=us-east-1a-node-0" in page.url and "attr.gen_ai.request.stream=true" in page.url
