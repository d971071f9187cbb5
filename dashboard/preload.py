"""Preload hints: the Streamlit element scripts each page draws with, named in the HTML of that page's URL (with
the dashboard's own style rules, `STYLE`).

Streamlit's frontend loads an element's script (the slider's, the Vega-Lite chart's, the table's) only when the
server's first message asks for that element, and that script's own dependencies after it: in a fresh browser
profile two more rounds of fetching and compiling after the app's own bundle, on the path of the first render.
The HTML that the server answers for a page's URL can name them up front instead (`<link rel="modulepreload">`),
so the browser fetches and compiles them while it loads the bundle and the session starts. Once the page is
drawn and quiet, a small inline script loads the other pages' (`later_script`), for a first click.

Which scripts an element needs is read from Streamlit's own build at start-up (the bundler's dependency lists in
its scripts: `__vite__mapDeps`), so the hints follow the installed Streamlit's file names; an element whose script
is not found is left out (the page then loads it as before). Nothing is fetched from outside the machine: the
hints name the server's own static files.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

#: The fonts every page draws with that Streamlit's HTML does not preload: the icons of the navigation and banners
#: (a font that blocks its text until loaded).
FONTS: tuple[str, ...] = ("MaterialSymbols-Rounded",)
#: The elements the sidebar draws on every page's first render (its buttons and toggles).
SIDEBAR: tuple[str, ...] = ("Button", "Checkbox")
#: The elements of the sidebar's filters (its time slider and multiselects): drawn only once their popover is opened,
#: so loaded once the page is drawn and quiet (`later_script`), with the other pages' scripts.
FILTERS: tuple[str, ...] = ("Slider", "Multiselect")
#: The elements no page draws in its first render, loaded once the page is drawn and quiet (`later_script`): the
#: filters' and the table grid, which the Alerts page draws once alerts are kept and the SQL console for its results.
LATER: tuple[str, ...] = (*FILTERS, "DataFrame")
#: What each Vega-Lite chart loads (the element, whose loader then loads Vega-Embed and its expression interpreter).
CHART: tuple[str, ...] = ("ArrowVegaLiteChart", "embed", "vega-interpreter")
#: Each page's URL path (as st.navigation names it; "" the default page) -> the elements it draws in a first
#: render, besides the sidebar's: the scripts named in that page's HTML. A small table is Markdown
#: (dashboard.formats.table), which needs no element script; "DataFrame" is the grid (a longer table: no page draws
#: one in a first render).
PAGE_ELEMENTS: dict[str, tuple[str, ...]] = {
    "": ("Metric", *CHART),
    "spike": ("Metric", "Radio", *CHART),
    "alerts": (),  # its table and counts only once `tailscope watch` has kept alerts
    "traces": ("TextInput", "Metric", *CHART),
    "shape": ("Radio", "Selectbox", *CHART),
    "replicas": ("Radio", "Selectbox", *CHART),
    "whatif": ("Slider", "NumberInput", "Selectbox", "Metric"),
    "capacity": ("Radio", "NumberInput", "Metric", *CHART),
    "cost": ("Radio", "NumberInput", "Metric"),  # its chart only once its expander is opened
    "sql": ("Selectbox", "TextArea"),
}

#: The dashboard's own style rules, in every page's HTML head: a static table wider than the page (the Spike page's
#: ten columns at 1,024 px) scrolls in its own box instead of running past the page's right edge. In the head rather
#: than written by the app (`st.markdown(..., unsafe_allow_html=True)` makes Streamlit's browser side load its
#: raw-HTML Markdown support, about 190 KB of script, on every page; `st.html` its sanitizer): no request, no element,
#: and in force from the first paint. Two attribute selectors outrank Streamlit's own one-class table rules, which
#: its styling library adds to the head after this.
STYLE = ("[data-testid=stMain] [data-testid=stMarkdownContainer] table {display: block; overflow-x: auto}")
#: Milliseconds a page stays drawn and quiet before it loads the other pages' element scripts (`later_script`), and
#: between two looks at whether it is.
QUIET_MS = 500
TICK_MS = 100

_MAP = re.compile(r"m\.f=\[([^\]]*)\]")
_LAZY = re.compile(r"import\(`\./([^`]+)`\)(?:\.then\([^()]*\))?,__vite__mapDeps\(\[([\d,]*)\]\)")
_LISTED = re.compile(r'(?:src|href)="\./static/(?:js|css)/([^"]+)"')


def static_dir() -> Path:
    """The installed Streamlit's static folder (index.html, static/js, static/css)."""
    from streamlit import file_util

    return Path(file_util.get_static_dir())


@cache
def dependencies(js_dir: Path) -> dict[str, tuple[str, ...]]:
    """Each script that a Streamlit script imports on demand -> the files the bundler loads with it (scripts and
    stylesheets, bare file names), read from every script of `js_dir` that lists them."""
    out: dict[str, tuple[str, ...]] = {}
    for path in sorted(js_dir.glob("*.js")):
        raw = path.read_bytes()
        if b"__vite__mapDeps" not in raw:  # most scripts (a few MB each): not decoded
            continue
        text = raw.decode("utf-8", errors="replace")
        listed = _MAP.search(text)
        if listed is None:
            continue
        files = [f.strip('"').removeprefix("./").rsplit("/", 1)[-1] for f in listed.group(1).split(",") if f]
        for name, idx in _LAZY.findall(text):
            deps = tuple(files[int(i)] for i in idx.split(",") if i and int(i) < len(files))
            out.setdefault(name, deps)
    return out


def _file_of(element: str, names: Iterable[str]) -> str | None:
    """The script file of `element` (`Slider` -> `Slider.<hash>.js`) among `names`, or None."""
    return next((n for n in sorted(names) if n.startswith(element + ".") and n.endswith(".js")), None)


def preload_files(elements: Iterable[str], deps: Mapping[str, tuple[str, ...]], listed: set[str]) -> list[str]:
    """The files to name for `elements`: each element's script and its bundler dependencies, in a stable order,
    without those the HTML already names (`listed`) and without repeats."""
    out: list[str] = []
    for element in elements:
        script = _file_of(element, deps)
        if script is None:
            continue
        for name in (*deps[script], script):
            if name not in listed and name not in out:
                out.append(name)
    return out


def link_tags(files: Iterable[str]) -> str:
    """`<link>` tags for `files`: a script as a module to preload, a stylesheet as a style, a font as a font."""
    tags = []
    for name in files:
        if name.endswith(".woff2"):
            tags.append(f'<link rel="preload" as="font" type="font/woff2" crossorigin href="./static/media/{name}">')
        elif name.endswith(".css"):
            tags.append(f'<link rel="preload" as="style" href="./static/css/{name}">')
        else:
            tags.append(f'<link rel="modulepreload" crossorigin href="./static/js/{name}">')
    return "\n".join(tags)


def later_script(files: Iterable[str], quiet_ms: int = QUIET_MS, tick_ms: int = TICK_MS) -> str:
    """An inline script that, once the page is first drawn (its title shown, no script running by the app's run
    state, which Streamlit's own end-to-end tests wait on, no element loading; checked every `tick_ms` after the
    load event; at most a minute), adds the tags of `files` (as link_tags') when the browser is next idle, then
    imports each script in turn, one per idle moment: the scripts the other pages draw with, fetched, compiled and
    evaluated while the user reads this page, so that a first click to another page, even at once, does not wait
    for them (a module is evaluated once per document: the page's own import of it later finds it done); "" without
    files."""
    hrefs = [f"./static/{'css' if name.endswith('.css') else 'js'}/{name}" for name in files]
    if not hrefs:
        return ""
    return ("<script>addEventListener('load',()=>{let n=0,k=0;const q=x=>document.querySelector(x),"
            "shown=x=>[...document.querySelectorAll(x)].filter(e=>e.checkVisibility()),"
            "t=setInterval(()=>{"
            "(q('[data-testid=stApp]')?.getAttribute('data-test-script-state')!=='notRunning'"
            "||!q('[data-testid=stHeading]')||q('[data-testid=stSkeleton]')"
            "||!shown('[data-testid=stVegaLiteChart]').every(c=>c.querySelector('svg,canvas'))"
            "||!shown('[data-testid=stDataFrame]').every(c=>c.querySelector('canvas')))"
            "?k=0:k++;"
            f"if(k<{max(1, quiet_ms // tick_ms)}&&++n<{60_000 // tick_ms})return;"
            "clearInterval(t);const idle=()=>new Promise(r=>(window.requestIdleCallback||setTimeout)(r));"
            f"(async()=>{{for(const h of {json.dumps(hrefs)}){{await idle();"
            "if(h.endsWith('.css')){const l=document.createElement('link');l.rel='preload';l.as='style';l.href=h;"
            "document.head.append(l)}else await import(h).catch(()=>{})}})()},"
            f"{tick_ms})}})</script>")


def page_heads(root: Path | None = None, pages: Mapping[str, tuple[str, ...]] = PAGE_ELEMENTS,
               shared: tuple[str, ...] = SIDEBAR, later: tuple[str, ...] = LATER, style: str = STYLE
               ) -> dict[str, bytes]:
    """Each page's URL path -> what to add to its HTML's head: `style` in a style element, tags for the sidebar's
    elements and the page's, then a script that names the other pages' and `later`'s (elements no page draws at
    first) once this one is drawn (`later_script`); only the style when Streamlit's build is not where it is
    expected."""
    root = static_dir() if root is None else root
    index = root / "index.html"
    js_dir = root / "static" / "js"
    styled = f"<style>{style}</style>"
    if not index.is_file() or not js_dir.is_dir():
        return {path: styled.encode() for path in pages}
    listed = set(_LISTED.findall(index.read_text(encoding="utf-8", errors="replace")))
    deps = dependencies(js_dir)
    every = preload_files((*shared, *(e for elements in pages.values() for e in elements), *later), deps, listed)
    media = sorted(p.name for p in (root / "static" / "media").glob("*.woff2"))
    fonts = [name for font in FONTS if (name := next((m for m in media if m.startswith(font + ".")), None))]
    heads = {}
    for path, elements in pages.items():
        now = [*fonts, *preload_files((*shared, *elements), deps, listed)]
        rest = later_script(f for f in every if f not in now)
        heads[path] = "\n".join(part for part in (styled, link_tags(now), rest) if part).encode()
    return heads


def page_of(scope: Mapping[str, Any]) -> str | None:
    """The page whose HTML an ASGI request asks for (its URL path's last part: "" the default page), or None for a
    request that is not an HTTP GET."""
    if scope.get("type") != "http" or scope.get("method") != "GET":
        return None
    return str(scope.get("path", "")).rstrip("/").rsplit("/", 1)[-1]


class PreloadHints:
    """ASGI middleware: the HTML answered for a page's URL gets that page's preload tags before `</head>`; every
    other response passes untouched. The HTML is asked for uncompressed (it is a few KB) so the tags can be added."""

    def __init__(self, app: Any, heads: Mapping[str, bytes] | None = None) -> None:
        self.app = app
        self.heads = page_heads() if heads is None else dict(heads)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        page = page_of(scope)
        tags = self.heads.get(page) if page is not None else None
        if not tags:
            await self.app(scope, receive, send)
            return
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"accept-encoding"]
        held: list[dict[str, Any]] = []
        body: list[bytes] = []

        async def hold(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                held.append(message)
                return
            if message["type"] != "http.response.body" or not held:
                await send(message)
                return
            body.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            start = held.pop()
            data = b"".join(body)
            kind = dict((k.lower(), v) for k, v in start.get("headers", [])).get(b"content-type", b"")
            if start.get("status") == 200 and kind.startswith(b"text/html") and b"</head>" in data:
                data = data.replace(b"</head>", tags + b"\n</head>", 1)
                start = {**start, "headers": [
                    *((k, v) for k, v in start.get("headers", [])
                      if k.lower() not in (b"content-length", b"etag", b"last-modified")),
                    (b"content-length", str(len(data)).encode())]}
            await send(start)
            await send({"type": "http.response.body", "body": data})

        await self.app({**scope, "headers": headers}, receive, hold)
