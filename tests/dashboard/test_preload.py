"""dashboard.preload: the element scripts each page's HTML names, read from Streamlit's build, and the middleware
that adds them to the HTML (and touches nothing else); dashboard.server's middleware that starts a page's work
when its HTML is asked for."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from dashboard import preload as P
from tests.needs import need

ROOT = Path(__file__).parents[2]


def _build(tmp_path: Path) -> Path:
    """A tiny build in Streamlit's layout: the entry script lists two on-demand scripts with their dependencies,
    and one of those lists a third (as Vega-Embed's loader does)."""
    js = tmp_path / "static" / "js"
    js.mkdir(parents=True)
    (tmp_path / "index.html").write_text(
        '<html><head><script type="module" src="./static/js/index.A1.js"></script>\n'
        '<link rel="modulepreload" href="./static/js/shared.S1.js"></head><body></body></html>')
    (js / "index.A1.js").write_text(
        'const __vite__mapDeps=(i,m=__vite__mapDeps,d=(m.f||(m.f=["./Slider.B2.js","./shared.S1.js",'
        '"./moment.C3.js","../css/Slider.D4.css","./Button.E5.js","./ButtonGroup.F6.js"])))=>i.map(i=>d[i]);'
        'x=(0,U.lazy)(()=>H(()=>import(`./Slider.B2.js`),__vite__mapDeps([0,1,2,3]),import.meta.url)),'
        'y=(0,U.lazy)(()=>H(()=>import(`./Button.E5.js`),__vite__mapDeps([4,1]),import.meta.url)),'
        'z=(0,U.lazy)(()=>H(()=>import(`./ButtonGroup.F6.js`),__vite__mapDeps([5,4]),import.meta.url));')
    (js / "loadVegaEmbed.G7.js").write_text(
        'const __vite__mapDeps=(i,m=__vite__mapDeps,d=(m.f||(m.f=["./embed.H8.js","./shared.S1.js"])))=>'
        'i.map(i=>d[i]);async function t(){await e(()=>import(`./embed.H8.js`).then(e=>e.n),'
        '__vite__mapDeps([0,1]),import.meta.url)}')
    (js / "plain.I9.js").write_text('import{a}from"./shared.S1.js";export{a};')
    (tmp_path / "static" / "media").mkdir()
    for font in ("MaterialSymbols-Rounded.J1.woff2", "SourceSansVF-Upright.ttf.K2.woff2"):
        (tmp_path / "static" / "media" / font).write_bytes(b"")
    return tmp_path


def test_the_dependency_lists_are_read_from_every_script_that_has_them(tmp_path: Path) -> None:
    deps = P.dependencies(_build(tmp_path) / "static" / "js")
    assert deps == {"Slider.B2.js": ("Slider.B2.js", "shared.S1.js", "moment.C3.js", "Slider.D4.css"),
                    "Button.E5.js": ("Button.E5.js", "shared.S1.js"),
                    "ButtonGroup.F6.js": ("ButtonGroup.F6.js", "Button.E5.js"),
                    "embed.H8.js": ("embed.H8.js", "shared.S1.js")}


def test_a_page_names_its_elements_scripts_once_each_and_not_those_the_html_names(tmp_path: Path) -> None:
    root = _build(tmp_path)
    heads = P.page_heads(root, {"": ("Button", "embed"), "spike": ("Missing",)}, shared=("Slider", "Button"))
    # Slider's own, its dependencies (shared.S1.js is the HTML's already), then Button's (not ButtonGroup's), then
    # embed's; Button named by the sidebar and the page alike is named once; an element without a script, none
    assert heads[""].decode().splitlines() == [
        f"<style>{P.STYLE}</style>",  # the dashboard's style, on every page
        '<link rel="preload" as="font" type="font/woff2" crossorigin '
        'href="./static/media/MaterialSymbols-Rounded.J1.woff2">',  # the icons' font, on every page
        '<link rel="modulepreload" crossorigin href="./static/js/Slider.B2.js">',
        '<link rel="modulepreload" crossorigin href="./static/js/moment.C3.js">',
        '<link rel="preload" as="style" href="./static/css/Slider.D4.css">',
        '<link rel="modulepreload" crossorigin href="./static/js/Button.E5.js">',
        '<link rel="modulepreload" crossorigin href="./static/js/embed.H8.js">']
    # a page names the other pages' once it is drawn (later_script): the Overview draws every element here, so none
    assert heads["spike"].decode().splitlines() == [*heads[""].decode().splitlines()[:6],
                                                    P.later_script(["embed.H8.js"])]
    # without Streamlit's build where it is expected, each page's head gets the style only
    assert P.page_heads(tmp_path / "nowhere", {"": (), "spike": ()}, style="a {b: c}") == {
        "": b"<style>a {b: c}</style>", "spike": b"<style>a {b: c}</style>"}


def test_every_element_named_is_in_the_installed_streamlit_and_every_page_has_an_entry() -> None:
    deps = P.dependencies(P.static_dir() / "static" / "js")
    elements = {e for page in P.PAGE_ELEMENTS.values() for e in page} | set(P.SIDEBAR) | set(P.LATER)
    assert {e for e in elements if P._file_of(e, deps) is None} == set()
    assert all(f"static/media/{font}." in P.page_heads()[""].decode() for font in P.FONTS)
    heads = P.page_heads()
    for page, tags in heads.items():
        named = re.findall(r'\./(static/(?:js|css|media)/[^"]+)"', tags.decode())
        assert named and len(named) == len(set(named)), page  # each file once: now, or once the page is drawn
        assert {href for href in named if not (P.static_dir() / href).is_file()} == set(), page
    pages = {p.stem for p in (ROOT / "dashboard" / "app_pages").glob("*.py")} - {"__init__"}
    assert set(heads) == {"" if p == "overview" else p for p in pages}  # the Overview is the default page: "/"


def _serve(inner: Any, path: str, accept: bytes = b"gzip") -> tuple[list[dict[str, Any]], list[Any]]:
    """One GET of `path` through PreloadHints around `inner` (heads: "" and "spike"); (what was sent, the request
    headers `inner` saw)."""
    seen: list[Any] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope["headers"])
        await inner(send)

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request"}

    hints = P.PreloadHints(app, {"": b"<link a>", "spike": b"<link b>"})
    scope = {"type": "http", "method": "GET", "path": path, "headers": [(b"accept-encoding", accept), (b"x", b"1")]}
    asyncio.run(hints(scope, receive, send))
    return sent, seen


def _html(status: int = 200, kind: bytes = b"text/html; charset=utf-8") -> Any:
    async def inner(send: Any) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", kind), (b"content-length", b"33"), (b"etag", b'"e"'),
                                (b"cache-control", b"no-cache")]})
        await send({"type": "http.response.body", "body": b"<html><head>", "more_body": True})
        await send({"type": "http.response.body", "body": b"</head><body></body></html>"})
    return inner


def test_the_html_of_a_page_gets_its_tags_and_a_true_length() -> None:
    sent, seen = _serve(_html(), "/spike")
    body = b"<html><head><link b>\n</head><body></body></html>"
    assert sent == [{"type": "http.response.start", "status": 200,
                     "headers": [(b"content-type", b"text/html; charset=utf-8"), (b"cache-control", b"no-cache"),
                                 (b"content-length", str(len(body)).encode())]},
                    {"type": "http.response.body", "body": body}]
    assert seen == [[(b"x", b"1")]]  # asked uncompressed, so the tags can be added
    sent, _ = _serve(_html(), "/")
    assert sent[1]["body"] == b"<html><head><link a>\n</head><body></body></html>"


def test_anything_else_passes_untouched() -> None:
    plain: list[dict[str, Any]] = [{"type": "http.response.start", "status": 200,
              "headers": [(b"content-type", b"text/html; charset=utf-8"), (b"content-length", b"33"),
                          (b"etag", b'"e"'), (b"cache-control", b"no-cache")]},
             {"type": "http.response.body", "body": b"<html><head>", "more_body": True},
             {"type": "http.response.body", "body": b"</head><body></body></html>"}]
    sent, seen = _serve(_html(), "/static/js/x.js")  # not a page: streamed as it comes, its headers as asked
    assert sent == plain and seen == [[(b"accept-encoding", b"gzip"), (b"x", b"1")]]
    sent, _ = _serve(_html(status=304), "/spike")  # not modified: no tags, the validators kept
    assert sent[0] == {**plain[0], "status": 304} and b"".join(m["body"] for m in sent[1:]) == plain[1]["body"] + \
        plain[2]["body"]
    sent, _ = _serve(_html(kind=b"application/json"), "/spike")
    assert sent[0] == {**plain[0], "headers": [(b"content-type", b"application/json"), *plain[0]["headers"][1:]]}


def test_the_other_pages_scripts_are_loaded_once_the_page_is_drawn_and_quiet() -> None:
    """later_script in Debian's chromium on a fake clock: nothing while the app's script runs, an element is
    loading or a shown chart is not drawn yet, nor before the page has stayed drawn for QUIET_MS (a rerun starts
    the count again); then each script imported once (evaluated: the page's own import later finds it done) and
    each stylesheet named; and at most a minute after the load event if the page is never drawn."""
    chromium = Path("/usr/bin/chromium")
    need(chromium.exists(), "Debian's chromium", "run `make browser-deps`")
    from playwright.sync_api import Route, sync_playwright

    html = ("<html><head>" + P.later_script(["a.js", "b.css"]) + "</head><body>"
            '<div data-testid="stApp" data-test-script-state="running"><div data-testid="stSkeleton"></div>'
            '<div data-testid="stHeading"><h1>Page</h1></div><div data-testid="stVegaLiteChart">chart</div></div>'
            "</body></html>")

    def serve(route: Route) -> None:  # the page, and a script that counts its evaluations, from no network
        page = route.request.url.endswith("/")
        route.fulfill(body=html if page else "window.evaluated = (window.evaluated || 0) + 1;",
                      content_type="text/html" if page else "text/javascript")

    named = "() => [...document.querySelectorAll('link')].map(l => [l.rel, l.href])"
    state = "s => document.querySelector('[data-testid=stApp]').setAttribute('data-test-script-state', s)"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium), args=["--no-sandbox", "--disable-gpu"])
        try:
            for drawn in (True, False):
                page = browser.new_page()
                page.route("http://tailscope.test/**", serve)
                page.clock.install(time=0)
                page.clock.pause_at(1_000)  # time moves only by run_for, however slow the machine
                page.goto("http://tailscope.test/")
                if drawn:
                    page.clock.run_for(5_000)
                    page.evaluate("() => document.querySelector('[data-testid=stSkeleton]').remove()")
                    page.evaluate(state, "notRunning")
                    page.clock.run_for(2_000)  # the chart not drawn yet
                    assert page.evaluate(named) == [] and page.evaluate("window.evaluated") is None
                    page.evaluate("() => document.querySelector('[data-testid=stVegaLiteChart]')"
                                  ".append(document.createElementNS('http://www.w3.org/2000/svg', 'svg'))")
                    page.clock.run_for(P.QUIET_MS - 2 * P.TICK_MS)
                    page.evaluate(state, "running")  # a click: the count starts again once it is drawn
                    page.clock.run_for(P.QUIET_MS)
                    page.evaluate(state, "notRunning")
                    page.clock.run_for(P.QUIET_MS - 2 * P.TICK_MS)
                else:
                    page.clock.run_for(60_000 - 2 * P.TICK_MS)
                assert page.evaluate(named) == [] and page.evaluate("window.evaluated") is None
                for _ in range(50):  # bounded: the imports resolve on the real event loop, the idle waits on the
                    page.clock.run_for(3 * P.TICK_MS)  # fake clock
                    if page.evaluate(named):
                        break
                assert page.evaluate("window.evaluated") == 1
                assert page.evaluate(named) == [["preload", "http://tailscope.test/static/css/b.css"]]
                page.close()
        finally:
            browser.close()


#: AppTest's element types -> the Streamlit element script each loads in the browser (dashboard.preload's names).
SCRIPTS = {"slider": "Slider", "multiselect": "Multiselect", "selectbox": "Selectbox", "radio": "Radio",
           "number_input": "NumberInput", "text_input": "TextInput", "text_area": "TextArea", "metric": "Metric",
           "vega_lite_chart": "ArrowVegaLiteChart", "dataframe": "DataFrame", "button": "Button",
           "toggle": "Checkbox", "checkbox": "Checkbox"}
#: The element types whose script is Streamlit's own bundle (Markdown, alerts, layout).
BUNDLED = {"main", "sidebar", "title", "subheader", "header", "markdown", "caption", "info", "warning", "error",
           "success", "flex_container", "column", "tab", "tab_container", "expander", "popover", "divider"}


def _types(node: Any, out: set[str], skip: str = "") -> set[str]:
    """The element types under `node` (AppTest's tree), not descending into elements of type `skip`."""
    out.add(str(node.type))
    children = getattr(node, "children", None) or {}
    for child in children.values() if isinstance(children, dict) else children:
        if child.type != skip:
            _types(child, out, skip)
    return out


def test_each_page_names_the_scripts_of_the_elements_its_first_render_draws(incident_store: Path,
                                                                             monkeypatch: Any) -> None:
    """A page whose element is not named in its HTML loads that element's script only once the session asks for it
    (a round of fetching on the path of its first render): every element a page draws is named, by the sidebar's
    (`SIDEBAR`) or the page's own (`PAGE_ELEMENTS`), and a page names none it does not draw; the sidebar's filters,
    in their closed popover, by `FILTERS`."""
    from streamlit.testing.v1 import AppTest

    from tests.dashboard.conftest import APP

    monkeypatch.setenv("TAILSCOPE_STORE", str(incident_store))
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.run()
    # the pages as drawn once the store's critical paths are computed (until then the replay pages stop early)
    from dashboard import data

    wb = data.workbench(str(data.store_path([])))  # the session's own (cached) workbench
    if wb.worker is not None:
        wb.worker.join(300)
    assert not wb.pending
    pages = sorted(p.stem for p in (ROOT / "dashboard" / "app_pages").glob("*.py") if p.stem != "__init__")
    for page in pages:
        at.switch_page(f"app_pages/{page}.py").run()
        assert not at.exception, (page, [e.message for e in at.exception])
        drawn = _types(at.main, set())
        assert drawn - SCRIPTS.keys() - BUNDLED == set(), page  # a new kind of element: say which script it loads
        named = {*P.SIDEBAR, *P.PAGE_ELEMENTS["" if page == "overview" else page]}
        scripts = {SCRIPTS[t] for t in drawn if t in SCRIPTS}
        assert scripts - named == set(), page
        # and the page names no script its first render does not draw (a chart's loaders come with its element):
        # a new profile would fetch and compile it on the way for nothing
        loaders = set(P.CHART) if "ArrowVegaLiteChart" in scripts else set()
        assert named - scripts - set(P.SIDEBAR) - loaders == set(), page
    sidebar = _types(at.sidebar, set(), skip="popover")
    assert {SCRIPTS[t] for t in sidebar if t in SCRIPTS} == set(P.SIDEBAR)
    popover = {t for p in at.sidebar.get("popover") for t in _types(p, set())}
    assert {SCRIPTS[t] for t in popover if t in SCRIPTS} == set(P.FILTERS)


def test_a_pages_html_without_filters_starts_its_work_on_the_store_the_start_up_opened(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """dashboard.server.PageWork: a GET of a page with work (the Capacity page's) starts it once the start-up has
    opened a store; not with a query string (filters in the URL: other work), not for another method, a websocket,
    a static file or a page without work; every request passes on untouched."""
    from dashboard import data, server

    started: list[tuple[object, str]] = []
    monkeypatch.setattr(data, "start_page_work", lambda db, page: started.append((db, page)))
    passed: list[dict[str, Any]] = []

    async def inner(scope: dict[str, Any], receive: Any, send: Any) -> None:
        passed.append(scope)

    work = server.PageWork(inner)
    asked: list[dict[str, Any]] = []

    def ask(path: str, query: bytes = b"", method: str = "GET", kind: str = "http") -> None:
        scope = {"type": kind, "method": method, "path": path, "query_string": query}
        asked.append(scope)
        asyncio.run(work(scope, None, None))

    monkeypatch.setattr(server, "OPENED", None)
    ask("/capacity")  # no store opened by the start-up (a ClickHouse table, the default store)
    db = object()
    monkeypatch.setattr(server, "OPENED", db)
    ask("/capacity")
    ask("/capacity", b"tenant=acme")
    ask("/capacity", method="HEAD")
    ask("/_stcore/stream", kind="websocket")
    ask("/static/js/capacity.js")
    ask("/spike")
    ask("/")
    assert started == [(db, "capacity")]
    assert passed == asked
