"""The sidebar filters by any attribute the report considers: a Kubernetes node narrows every count to exactly its
requests, the filter travels in a link, and the attribute list comes from analysis."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import parse_qs

import pytest
from streamlit.testing.v1 import AppTest

from analysis.attribute_filters import AttributeFilter, attribute_choices
from analysis.engine.connect import connect
from dashboard import links
from dashboard.engine import FILTER_DIMENSIONS, Filters
from sample_traces.emit import write_otlp
from sample_traces.fleet import default_config, simulate
from tests.dashboard.conftest import APP, shown_tables
from tests.sample_traces.cli_checks import ingested

NODE_KEY = "k8s.node.name"
NODE = "us-east-1b-node-3"


@pytest.fixture(scope="module")
def fleet_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """Two minutes of the simulated fleet (replicas two to a Kubernetes node) and each replica's node."""
    cfg = default_config(duration_s=120.0, rate=5.0)
    out = tmp_path_factory.mktemp("fleet")
    traces = write_otlp(out / "fleet.otlp.jsonl.gz", cfg, simulate(cfg, 3), 3)
    return ingested(out / "store", traces), {r.name: r.node for r in cfg.replicas}


def _plain_count(store: Path, replicas: list[str]) -> int:
    con = connect(store)
    try:
        row = con.execute("SELECT count(*) FROM requests WHERE list_contains(?, replica)", [replicas]).fetchone()
    finally:
        con.close()
    assert row is not None
    return int(row[0])


def _metric(at: AppTest, label: str) -> str:
    return str(next(m.value for m in at.metric if m.label == label))


def test_analysis_lists_the_node_and_filters_to_exactly_its_requests(
        fleet_store: tuple[Path, dict[str, str]]) -> None:
    store, nodes = fleet_store
    con = connect(store)
    try:
        choices = attribute_choices(con)
        assert choices[NODE_KEY]["source"] == "resource"
        assert choices[NODE_KEY]["values"] == sorted(set(nodes.values()))
        for node in (NODE, "us-east-1c-node-0"):
            cond, params = AttributeFilter(NODE_KEY, "resource", (node,)).where()
            row = con.execute(f"SELECT count(*) FROM requests WHERE {cond}", params).fetchone()
            assert row is not None and row[0] == _plain_count(store, [r for r, n in nodes.items() if n == node])
        # a number is filtered by its bucket: the 0 bucket is the requests that read no cached token
        zero = choices["gen_ai.usage.cache_read.input_tokens"]
        assert zero["kind"] == "number" and zero["values"][0] == "0-0"
        cond, params = AttributeFilter("gen_ai.usage.cache_read.input_tokens", "request", ("0-0",), ((0, 0),)).where()
        row = con.execute(f"SELECT count(*) FROM requests WHERE {cond}", params).fetchone()
        plain = con.execute("SELECT count(*) FROM requests r JOIN spans s ON s.TraceId = r.trace_id AND s.SpanId = "
                            "r.span_id WHERE s.SpanAttributes['gen_ai.usage.cache_read.input_tokens'] = '0'").fetchone()
        assert row is not None and plain is not None and row[0] == plain[0] > 0
    finally:
        con.close()


def _plain_count_where(store: Path, replicas: list[str], key: str, values: list[str]) -> int:
    """Requests on `replicas` whose own span holds `key` with one of `values` (a plain join)."""
    con = connect(store)
    try:
        row = con.execute("SELECT count(*) FROM requests r JOIN spans s ON s.TraceId = r.trace_id AND s.SpanId = "
                          "r.span_id WHERE s.IsRequest AND list_contains(?, r.replica) AND list_contains(?, "
                          "s.SpanAttributes[?])", [replicas, values, key]).fetchone()
    finally:
        con.close()
    assert row is not None
    return int(row[0])


def test_the_sidebar_filters_by_a_node_and_a_link_carries_it(fleet_store: tuple[Path, dict[str, str]],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    store, nodes = fleet_store
    want = format(_plain_count(store, [r for r, n in nodes.items() if n == NODE]), ",")
    monkeypatch.setenv("TAILSCOPE_STORE", str(store))
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    everything = _metric(at, "requests")
    # on a store the attributes are offered at once (listed from the materialized hours' files, or the spans)
    assert not [t for t in at.sidebar.toggle if t.key == "f_attr_on"]
    assert NODE_KEY in at.multiselect(key="f_attrs").options
    at.multiselect(key="f_attrs").select(NODE_KEY).run()
    at.multiselect(key=f"f_attr_values:{NODE_KEY}").select(NODE).run()
    assert not at.exception, [e.message for e in at.exception]
    assert _metric(at, "requests") == want != everything
    # the URL holds the filter, and a link with it opens the same view
    held = {k: v if isinstance(v, list) else [v] for k, v in at.query_params.items()}
    assert held[links.ATTR] == [NODE_KEY] and held[links.ATTR_VALUE] == [NODE]
    url = links.url("overview", Filters(attributes=(AttributeFilter(NODE_KEY, "resource", (NODE,)),)),
                    FILTER_DIMENSIONS)
    again = AppTest.from_file(str(APP), default_timeout=120)
    for key, values in parse_qs(url.split("?", 1)[1]).items():
        again.query_params[key] = values
    again.run()
    assert not again.exception, [e.message for e in again.exception]
    assert again.multiselect(key="f_attrs").value == [NODE_KEY]
    assert _metric(again, "requests") == want
    # a second attribute narrows further (AND across keys), two of its values widen it (OR within a key)
    stream = "gen_ai.request.stream"
    at.multiselect(key="f_attrs").select(stream).run()
    at.multiselect(key=f"f_attr_values:{stream}").select("true").run()
    assert not at.exception, [e.message for e in at.exception]
    on_node = [r for r, n in nodes.items() if n == NODE]
    both = _plain_count_where(store, on_node, stream, ["true"])
    assert 0 < both < _plain_count(store, on_node)
    assert _metric(at, "requests") == format(both, ",")
    at.multiselect(key=f"f_attr_values:{stream}").select("false").run()
    assert _metric(at, "requests") == format(_plain_count_where(store, on_node, stream, ["false", "true"]), ",")
    # several filters travel as `attr.<key>`, and a link with them opens the same view
    held = {k: v if isinstance(v, list) else [v] for k, v in at.query_params.items()}
    assert held[links.ATTR_PREFIX + NODE_KEY] == [NODE] and held[links.ATTR_PREFIX + stream] == ["false", "true"]
    assert links.ATTR not in held and links.ATTR_VALUE not in held
    third = AppTest.from_file(str(APP), default_timeout=120)
    for key, values in held.items():
        third.query_params[key] = values
    third.run()
    assert not third.exception, [e.message for e in third.exception]
    assert third.multiselect(key="f_attrs").value == [NODE_KEY, stream]
    assert third.multiselect(key=f"f_attr_values:{stream}").value == ["false", "true"]
    assert _metric(third, "requests") == _metric(at, "requests")


@pytest.mark.parametrize(("page", "prefix"), [("app_pages/replicas.py", "replica"), ("app_pages/shape.py", "shape")])
def test_a_page_groups_by_a_node(fleet_store: tuple[Path, dict[str, str]], monkeypatch: pytest.MonkeyPatch,
                                 page: str, prefix: str) -> None:
    store, nodes = fleet_store
    monkeypatch.setenv("TAILSCOPE_STORE", str(store))
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.switch_page(page).run()
    assert not [t for t in at.toggle if t.key == f"{prefix}_by_attr"]  # offered at once on a store
    at.selectbox(key=f"{prefix}_attribute").select(NODE_KEY).run()
    assert not at.exception, [e.message for e in at.exception]
    table = at.dataframe[-1].value
    want = {node: _plain_count(store, [r for r, n in nodes.items() if n == node]) for node in set(nodes.values())}
    got = dict(zip(table["value"], table["requests"], strict=True))
    assert got == {n: c for n, c in want.items() if c}
    # beside it a chart of the same values, slowest first, on an axis named by the attribute
    spec = json.loads(at.get("vega_lite_chart")[-1].proto.spec)
    x = spec["layer"][0]["encoding"]["x"]
    assert x["title"] == NODE_KEY and x["sort"] == list(table["value"])
    assert list(table["p99_ms"]) == sorted(table["p99_ms"], reverse=True)



def test_an_attribute_alert_link_opens_with_its_attribute_filter(fleet_store: tuple[Path, dict[str, str]],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The link `tailscope watch` puts on an alert explained by an attribute (analysis.watch.records; the alert
    itself: tests/analysis/test_attributes.py) opens the Spike page filtered to that attribute's value."""
    from analysis.watch.records import spike_url, with_attribute

    store, _ = fleet_store
    alert = {"attribute": NODE_KEY, "value": NODE, "attribute_source": "resource"}
    link = with_attribute(spike_url("http://127.0.0.1:8501", 1, 2), alert)
    assert link is not None
    page, query = link.rsplit("/", 1)[1].split("?", 1)
    assert page == "spike"
    monkeypatch.setenv("TAILSCOPE_STORE", str(store))
    at = AppTest.from_file(str(APP), default_timeout=120)
    for key, values in parse_qs(query).items():
        at.query_params[key] = values
    at.switch_page("app_pages/spike.py").run()
    assert not at.exception, [e.message for e in at.exception]
    assert at.multiselect(key="f_attrs").value == [NODE_KEY]
    assert at.multiselect(key=f"f_attr_values:{NODE_KEY}").value == [NODE]


def test_the_listing_reads_the_materialized_hours_and_lists_the_same(fleet_store: tuple[Path, dict[str, str]],
                                                                    tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """With the hours materialized (as ingest leaves them) the dashboard lists the attributes from the files written
    with them (as the report reads them): the same listing as from the spans (a copy without its materialized
    hours), which analysis gives too."""
    import shutil

    from dashboard.data import Workbench

    store, _ = fleet_store
    assert list(store.glob("requests/*/*/attributes-*.arrow"))
    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    shutil.rmtree(copy / "requests")
    con = connect(copy)
    try:
        want = attribute_choices(con)
    finally:
        con.close()
    n = _plain_count(store, list(fleet_store[1]))
    for path, live in ((store, 0), (copy, n)):
        wb = Workbench(path.resolve())
        try:
            wb.refresh()
            assert wb.attribute_choices() == want, path
            # offered at once while listing is cheap: a request read from the spans counts whole, one of a
            # materialized hour a quarter; past the budget the sidebar asks first, saying why
            assert (wb.live_requests, wb.stored_requests) == (live, n - live) and wb.can("attribute_listing")
            monkeypatch.setattr("dashboard.data.LISTING_BUDGET_REQUESTS", n // 4 + 1)
            assert wb.can("attribute_listing") == (live == 0)
            assert wb.missing("attribute_listing") == ("" if live == 0 else
                                                       f"listing them reads the values of {n:,} requests, {n:,} of "
                                                       "them from the spans (hours not materialized yet)")
            monkeypatch.setattr("dashboard.data.LISTING_BUDGET_REQUESTS", n // 4 - 1)
            assert not wb.can("attribute_listing")
            monkeypatch.undo()
        finally:
            wb.con.close()


def _follow(link: str, monkeypatch: pytest.MonkeyPatch, store: Path) -> AppTest:
    """The app opened at `link` (the Overview's path with its query), as a browser following it would."""
    page, query = link.split("?", 1)
    assert page == links.OVERVIEW
    monkeypatch.setenv("TAILSCOPE_STORE", str(store))
    at = AppTest.from_file(str(APP), default_timeout=120)
    for key, values in parse_qs(query).items():
        at.query_params[key] = values
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def test_the_spike_page_links_each_named_value_to_its_filter(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """On a node's spike (tests/analysis/test_attributes.py: node-2 slow, its replicas the finer level) the node's
    row and each finer replica carry a link; followed, it opens the Overview filtered to exactly that value."""
    from tests.analysis.test_attributes import NODE as NODE_OF
    from tests.analysis.test_attributes import SLOW_NODE, node_store

    store = node_store(tmp_path / "nodes")
    monkeypatch.setenv("TAILSCOPE_STORE", str(store))
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.run()
    at.switch_page("app_pages/spike.py").run()
    assert not at.exception, [e.message for e in at.exception]
    table = shown_tables(at)[0]
    lead = table.iloc[0]
    assert (lead["dimension"], lead["value"]) == (NODE_KEY, SLOW_NODE)
    on_node = [r for r, n in NODE_OF.items() if n == SLOW_NODE]
    link = re.fullmatch(r"\[filter to this value\]\((.+)\)", lead["filter"])  # a Markdown link
    assert link, lead["filter"]
    node_view = _follow(link.group(1), monkeypatch, store)
    assert node_view.multiselect(key="f_attrs").value == [NODE_KEY]
    assert node_view.multiselect(key=f"f_attr_values:{NODE_KEY}").value == [SLOW_NODE]
    assert _metric(node_view, "requests") == format(_plain_count(store, on_node), ",")
    # the hierarchy's finer level: each replica of the node, linked to the replica filter
    said = " ".join(m.value for m in at.markdown)
    finer = re.findall(r"finer · replica = (\S+) alone explains \S+ · \[filter to this value\]\(([^)]+)\)", said)
    assert finer and {r for r, _ in finer} <= set(on_node)
    replica, link = finer[0]
    replica_view = _follow(link, monkeypatch, store)
    assert replica_view.multiselect(key="f_replica").value == [replica]
    assert replica_view.multiselect(key="f_attrs").value == []
    assert _metric(replica_view, "requests") == format(_plain_count(store, [replica]), ",")
