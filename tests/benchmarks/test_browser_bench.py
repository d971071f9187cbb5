"""benchmarks.bench_dashboard_browser's before/after parts, without a browser: the order of the trees in each round,
the comparison table's ratios, and the checks on the tree --against names."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks import bench_dashboard_browser as B
from tests.needs import need_c


def _sample(wall: float, cpu: float) -> B.Sample:
    return B.Sample(wall_s=wall, browser_cpu_s=cpu, server_cpu_s=0.5, main_thread_s=0.0, requests=1, kbytes=10.0)


def test_the_trees_take_turns_first() -> None:
    other = Path("/elsewhere")
    assert [B.tree_order(r, [None, other]) for r in range(4)] == [[None, other], [other, None]] * 2
    assert B.tree_order(1, [None]) == [None]


def test_the_comparison_gives_each_measurements_medians_and_ratios() -> None:
    bare = [("bare Streamlit page: new tab", [_sample(1.0, 1.0)], float("inf"))]
    this = [*bare, ("click: Spike", [_sample(0.3, 0.6), _sample(0.5, 0.8), _sample(0.4, 2.0)], 0.5)]
    other = [*bare, ("click: Spike", [_sample(0.8, 1.6), _sample(0.6, 1.0), _sample(1.0, 1.7)], 0.5)]
    assert B.versus(this, other)[2:] == [
        "| click: Spike | 0.40 / 0.80 | 0.50 | 0.80 / 1.60 | 0.50 | 0.50 / 0.50 | 1.00 | 10 / 10 | 0 / 0 |"]


def test_a_tree_to_compare_against_must_be_a_checkout(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="not a tailscope source tree"), B.other_tree(str(tmp_path)):
        pass
    with pytest.raises(SystemExit, match="neither a directory nor a git ref"), B.other_tree("no-such-ref-xyz"):
        pass
    import importlib.util

    need_c(importlib.util.find_spec("analysis._replay") is not None, "analysis._replay")
    import analysis._replay as replay  # mapped into this process from this tree

    assert B.foreign_parts([os.getpid()], B.ROOT) == []
    assert os.path.realpath(str(replay.__file__)) in B.foreign_parts([os.getpid()], tmp_path)


def test_the_static_files_a_page_names_are_fetched_once_each(tmp_path: Path) -> None:
    """A page whose HTML names three static files, one twice and one as a stylesheet: each fetched once, over the
    connections, their sizes summed; a link outside static/ is not one of them."""
    import functools
    import http.server
    import threading

    (tmp_path / "static" / "js").mkdir(parents=True)
    (tmp_path / "static" / "css").mkdir()
    (tmp_path / "static" / "js" / "a.js").write_bytes(b"x" * 1024)
    (tmp_path / "static" / "js" / "b.js").write_bytes(b"y" * 2048)
    (tmp_path / "static" / "css" / "c.css").write_bytes(b"z" * 512)
    (tmp_path / "page").mkdir()
    (tmp_path / "page" / "index.html").write_text(
        '<script src="./static/js/a.js"></script><link rel="modulepreload" href="./static/js/b.js">'
        '<link href="./static/css/c.css"><link rel="modulepreload" href="./static/js/a.js"><a href="./other.html">')
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as httpd:
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        try:
            assert B.static_files(url, "page/") == ["static/js/a.js", "static/js/b.js", "static/css/c.css"]
            got = B.fetch_static(url, "page/", [], connections=2)
        finally:
            httpd.shutdown()
    assert (got.requests, got.kbytes, got.browser_cpu_s, got.server_cpu_s) == (3, 3.5, 0.0, 0.0)


def test_a_store_is_materialized_but_its_last_hours_left_live(tmp_path: Path) -> None:
    """A store over four hours: with two live hours the first two are written and the last two stay live, even
    when their files had been written before; with none every hour is written."""
    from analysis.engine.materialize import HOUR_NS, snapshot
    from benchmarks.bench_dashboard import materialize_store
    from tests.dashboard.incident_store import START_NS, write_incident_store

    store = tmp_path / "store"
    write_incident_store(store, requests=800, duration_s=3.5 * 3600)
    hours = [START_NS + i * HOUR_NS for i in range(4)]
    assert snapshot(store).stale == hours
    assert materialize_store(store, 0) == (4, 0)
    assert sorted(snapshot(store).fresh) == hours
    assert materialize_store(store, 2) == (0, 2)  # the last two hours' files removed, the others kept
    snap = snapshot(store)
    assert (sorted(snap.fresh), snap.stale) == (hours[:2], hours[2:])
    assert materialize_store(store, 1) == (1, 1)
    assert snapshot(store).stale == hours[3:]


def test_a_render_is_split_at_its_first_and_last_websocket_message() -> None:
    """Messages before the act (a click's page received them earlier) and after the page was drawn are not the
    render's; the rest split the time at the first and the last; without one the whole time comes before."""
    messages = [(50.0, 2048.0), (1200.0, 512.0), (1500.0, 1024.0), (2600.0, 512.0), (4000.0, 99.0)]
    assert B.split(messages, 1000.0, 3000.0) == (0.2, 1.4, 0.4, 2.0)
    assert B.split(messages, 0.0, 5000.0) == (0.05, 3.95, 1.0, (2048 + 512 + 1024 + 512 + 99) / 1024)
    assert B.split(messages, 4100.0, 4600.0) == (0.5, 0.0, 0.0, 0.0)
    assert B.split([], 0.0, 1500.0) == (1.5, 0.0, 0.0, 0.0)
