"""The sidebar filters by any attribute the report considers: a Kubernetes node narrows every count to exactly its
requests, the filter travels in a link, and the attribute list comes from analysis."""

from __future__ import annotations

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
from tests.dashboard.conftest import APP
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


def test_the_sidebar_filters_by_a_node_and_a_link_carries_it(fleet_store: tuple[Path, dict[str, str]],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    store, nodes = fleet_store
    want = format(_plain_count(store, [r for r, n in nodes.items() if n == NODE]), ",")
    monkeypatch.setenv("TAILSCOPE_STORE", str(store))
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    everything = _metric(at, "requests")
    assert NODE_KEY in at.selectbox(key="f_attr").options
    at.selectbox(key="f_attr").select(NODE_KEY).run()
    at.multiselect(key=f"f_attr_values:{NODE_KEY}").select(NODE).run()
    assert not at.exception, [e.message for e in at.exception]
    assert _metric(at, "requests") == want != everything
    # the URL holds the filter, and a link with it opens the same view
    held = {k: v if isinstance(v, list) else [v] for k, v in at.query_params.items()}
    assert held[links.ATTR] == [NODE_KEY] and held[links.ATTR_VALUE] == [NODE]
    url = links.url("overview", Filters(attribute=AttributeFilter(NODE_KEY, "resource", (NODE,))), FILTER_DIMENSIONS)
    again = AppTest.from_file(str(APP), default_timeout=120)
    for key, values in parse_qs(url.split("?", 1)[1]).items():
        again.query_params[key] = values
    again.run()
    assert not again.exception, [e.message for e in again.exception]
    assert again.selectbox(key="f_attr").value == NODE_KEY
    assert _metric(again, "requests") == want
