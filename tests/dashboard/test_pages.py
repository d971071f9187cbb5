"""AppTest: every page runs on the incident store and on an empty store; filters change the numbers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from analysis.engine.connect import connect
from analysis.engine.percentiles import percentile_series
from analysis.report import explain_window
from analysis.stats.verdicts import against_baseline, detection_window_s
from dashboard import data
from dashboard.charts import STAGE_COLORS
from tests.dashboard.conftest import APP, REQUESTS, shown_tables
from tests.dashboard.incident_store import START_NS
from tests.sql import one

PAGES = tuple(f"app_pages/{name}.py" for name in ("overview", "spike", "traces", "shape", "replicas", "whatif", "sql"))


def _app(store: Path, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    monkeypatch.setenv("TAILSCOPE_STORE", str(store))
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def _metric(at: AppTest, label: str) -> str:
    values = [m.value for m in at.metric if m.label == label]
    assert values, f"no metric {label!r} among {[m.label for m in at.metric]}"
    return str(values[0])


def _count(store: Path, where: str = "true") -> int:
    con = connect(store)
    try:
        row = con.execute(f"SELECT count(*) FROM requests WHERE {where}").fetchone()
    finally:
        con.close()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("page", PAGES)
def test_each_page_runs_on_the_incident_store(incident_store: Path, monkeypatch: pytest.MonkeyPatch,
                                              page: str) -> None:
    at = _app(incident_store, monkeypatch)
    at.switch_page(page).run()
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error or page == "app_pages/replicas.py"  # the replicas page flags the outlier with st.error


@pytest.mark.parametrize("page", PAGES)
def test_each_page_runs_on_an_empty_store(empty_store: Path, monkeypatch: pytest.MonkeyPatch, page: str) -> None:
    at = _app(empty_store, monkeypatch)
    at.switch_page(page).run()
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error
    if page != "app_pages/sql.py":
        assert at.info, "an empty store shows an explanation, not a blank page"


def test_overview_counts_and_spike(incident_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(incident_store, monkeypatch)
    assert _metric(at, "requests") == f"{REQUESTS:,}"
    assert _metric(at, "timeouts") == format(_count(incident_store, "status = 'timeout'"), ",")
    assert _metric(at, "errors") == format(_count(incident_store, "status = 'error'"), ",")
    assert int(_metric(at, "spikes")) >= 1
    assert any("Spike" in w.value for w in at.warning)


def test_overview_draws_the_open_latency_tab_only(incident_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The percentile charts are tabs: a first run draws end-to-end's (and the two count charts), a picked tab its
    own chart instead."""
    at = _app(incident_store, monkeypatch)
    assert [t.label for t in at.tabs] == ["end-to-end", "TTFT", "TPOT"]
    counts = ["requests per window", "failed requests per window (own scale)"]
    assert [json.loads(c.proto.spec)["title"] for c in at.get("vega_lite_chart")] == ["end-to-end", *counts]
    at.session_state["overview_latency"] = "TPOT"
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert [json.loads(c.proto.spec)["title"] for c in at.get("vega_lite_chart")] == ["TPOT", *counts]


def test_replica_filter_changes_the_numbers(incident_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(incident_store, monkeypatch)
    p99_all = _metric(at, "p99")
    at.multiselect(key="f_replica").select("replica-05").run()
    assert not at.exception
    assert _metric(at, "requests") == format(_count(incident_store, "replica = 'replica-05'"), ",")
    assert _metric(at, "p99") != p99_all
    # without the slow replica the spike is gone
    others = [f"replica-{i:02d}" for i in range(8) if i != 5]
    at.multiselect(key="f_replica").unselect("replica-05").run()
    for r in others:
        at.multiselect(key="f_replica").select(r)
    at.run()
    assert _metric(at, "requests") == format(_count(incident_store, "replica <> 'replica-05'"), ",")
    assert _metric(at, "spikes") == "0"


def test_a_filter_too_narrow_to_judge_is_no_all_clear(incident_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """replica-05 alone (2,500 requests over 30 minutes) is too few for any window to be judged: the pages say
    detection could not judge, and show the unfiltered spikes as context, instead of "0 spikes"."""
    n = _count(incident_store, "replica = 'replica-05'")
    assert detection_window_s(n, 1_800.0) is None
    at = _app(incident_store, monkeypatch)
    at.multiselect(key="f_replica").select("replica-05").run()
    assert not at.exception
    assert _metric(at, "spikes") == "?"  # not a count: the help and the banner say why
    assert next(m.help for m in at.metric if m.label == "spikes").startswith("Not judged: spike detection could not")
    (said,) = [e.value for e in at.error if "could not judge" in e.value]
    assert f"{n:,} requests match" in said and "Without the filters, this range has 1 spike(s)" in said
    at.switch_page("app_pages/spike.py").run()
    assert not at.exception
    assert any("could not judge" in e.value for e in at.error)
    assert not at.success and not at.radio  # no "no spike", and no window explained under the filter
    # so the chart takes no brush, and its caption does not invite one
    (spec,) = (json.loads(c.proto.spec) for c in at.get("vega_lite_chart"))
    assert "params" not in spec
    assert not any("Drag on the chart" in c.value for c in at.caption)


def test_a_quiet_window_gets_no_cause(incident_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A linked window whose p99 is below the baseline says so, with no green "cause"."""
    con = connect(incident_store)
    try:
        series = percentile_series(con, "e2e", window_s=120)
        quiet = series.sort("p99_ms").row(0, named=True)["window_start_ns"]
        item = explain_window(con, quiet, quiet + 120 * 10**9)
    finally:
        con.close()
    assert against_baseline(item) == "at or below"
    monkeypatch.setenv("TAILSCOPE_STORE", str(incident_store))
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.query_params["start_ns"], at.query_params["end_ns"] = str(quiet), str(quiet + 120 * 10**9)
    at.switch_page("app_pages/spike.py").run()
    assert not at.exception
    choice = at.radio(key="spike_choice").value
    assert choice is not None and choice.startswith("linked ")
    assert any("at or below the baseline p99" in i.value for i in at.info)
    assert not at.success


def test_filters_survive_a_page_switch(incident_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(incident_store, monkeypatch)
    at.multiselect(key="f_tenant").select("acme").run()
    at.switch_page("app_pages/replicas.py").run()
    table = shown_tables(at)[0]
    assert sum(int(n.replace(",", "")) for n in table["requests"]) == _count(incident_store, "tenant = 'acme'")
    # the filters' widgets sit in the sidebar's popover; the line under it names the filter set
    (popover,) = at.sidebar.get("popover")
    assert popover.proto.popover.label == "Filters"
    assert "f_tenant" in [m.key for m in popover.multiselect]
    assert "tenant = acme" in [c.value for c in at.sidebar.caption]


def test_time_range_filter(incident_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(incident_store, monkeypatch)
    assert "All requests" in [c.value for c in at.sidebar.caption]
    lo, hi = at.slider(key="f_time").value
    mid = lo + (hi - lo) / 2
    at.slider(key="f_time").set_value((lo, mid)).run()
    shown = int(_metric(at, "requests").replace(",", ""))
    assert 0 < shown < REQUESTS
    assert f"until {mid:%m-%d %H}\\:{mid:%M} UTC" in [c.value for c in at.sidebar.caption]  # ":" escaped


def test_the_filter_summary_line() -> None:
    """The sidebar's one-line summary of the filters: each part in order, Markdown's characters escaped."""
    from analysis.attribute_filters import AttributeFilter
    from dashboard.engine import Filters
    from dashboard.sidebar import summary_text

    since, until = 1_700_000_000 * 10**9, 1_700_003_600 * 10**9  # 2023-11-14 22:13:20 and 23:13:20 UTC
    assert summary_text(Filters()) == "All requests"
    assert summary_text(Filters(since_ns=since)) == "from 11-14 22\\:13 UTC"
    assert summary_text(Filters(since_ns=since, until_ns=until, model=("m1",), replica=("replica-05", "replica-07"),
                                attributes=(AttributeFilter("k8s.node.name", "resource", ("node_*1",)),))) == (
        "11-14 22\\:13–11-14 23\\:13 UTC · model = m1 · replica = replica-05, replica-07 · "
        "k8s.node.name = node\\_\\*1")


def test_spike_page_names_the_slow_replica(incident_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(incident_store, monkeypatch)
    at.switch_page("app_pages/spike.py").run()
    assert not at.exception
    lead = at.success[0].value
    assert "replica = replica-05" in lead
    stages = " ".join(m.value for m in at.markdown)
    assert "**decode**" in stages


def test_spike_page_draws_every_stage_once_opened(incident_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the sentence naming the top stage, the chart of every stage (the tail against the baseline tail) sits in
    a closed expander: sent and drawn only once it is opened, with the explanation's stage figures."""
    import pyarrow as pa

    at = _app(incident_store, monkeypatch)
    at.switch_page("app_pages/spike.py").run()
    assert not at.exception

    def stage_charts() -> list:
        return [c for c in at.get("vega_lite_chart") if "yOffset" in json.loads(c.proto.spec).get("encoding", {})]

    assert len(at.get("vega_lite_chart")) == 2 and not stage_charts()  # the spike's chart and the counterfactual
    at.session_state["spike_stages"] = True
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    (chart,) = stage_charts()
    spec = json.loads(chart.proto.spec)
    assert spec["encoding"]["opacity"]["scale"]["domain"] == ["baseline tail", "spike tail"]
    drawn = pa.ipc.open_stream(chart.proto.datasets[0].data.data).read_all().to_pandas()
    wb = data.workbench(str(incident_store))  # the explanation of the window shown (in the page's URL)
    start_ns, end_ns = (int(str(at.query_params[k])) for k in ("start_ns", "end_ns"))
    ex = data.explain(wb, str(incident_store), wb.version, data.Filters(), start_ns, end_ns)
    assert ex["stages"]
    assert sorted(zip(drawn["stage"], drawn["slice"], drawn["ms"], strict=True)) == sorted(
        [(s["stage"], "spike tail", s["tail_ms"]) for s in ex["stages"]]
        + [(s["stage"], "baseline tail", s["baseline_ms"]) for s in ex["stages"]])


def test_spike_page_links_a_value_and_a_pair_to_their_filters(incident_store: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The replica the spike names, and a pair of it with the model, link to the Overview filtered to exactly
    them; a pair with a dimension the sidebar does not filter (model_version) has no link. Pairs folded under the
    replica (each explains no more) keep their links in the folded table."""
    from urllib.parse import parse_qs

    from dashboard import links

    at = _app(incident_store, monkeypatch)
    at.session_state["spike_folded"] = True  # the folded pairs' table is drawn once its expander is opened
    at.switch_page("app_pages/spike.py").run()
    single, *rest = shown_tables(at)
    pairs = pd.concat([t for t in rest if "&" in "".join(t.get("dimension", []))])
    assert (single.iloc[0]["dimension"], single.iloc[0]["value"]) == ("replica", "replica-05")
    by_pair = {(r["dimension"], r["value"]): r["filter"] for _, r in pairs.iterrows()}
    assert by_pair[("replica&model_version", "replica-05&v2")] == "–"  # no link
    for link, where in ((single.iloc[0]["filter"], "replica = 'replica-05'"),
                        (by_pair[("replica&model", "replica-05&llama-3-8b")],
                         "replica = 'replica-05' AND model = 'llama-3-8b'")):
        found = re.fullmatch(r"\[filter to this value\]\((.+)\)", link)
        assert found, link
        page, query = found.group(1).split("?", 1)
        assert page == links.OVERVIEW
        followed = AppTest.from_file(str(APP), default_timeout=120)
        for key, values in parse_qs(query).items():
            followed.query_params[key] = values
        followed.run()
        assert not followed.exception, [e.message for e in followed.exception]
        assert int(_metric(followed, "requests").replace(",", "")) == _count(incident_store, where) < REQUESTS


def test_replicas_page_marks_the_outlier(incident_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(incident_store, monkeypatch)
    at.switch_page("app_pages/replicas.py").run()
    assert "replica-05" in at.error[0].value
    table = shown_tables(at)[0]
    assert table.loc[table["outlier"] == "yes", "replica"].tolist() == ["replica-05"]
    assert set(table["outlier"]) == {"yes", ""}
    assert sum(int(n.replace(",", "")) for n in table["requests"]) == REQUESTS
    # filtered to one replica there is no fleet to compare with: the page says so, neither outlier nor all clear
    one = AppTest.from_file(str(APP), default_timeout=120)
    one.query_params["replica"] = "replica-02"
    one.switch_page("app_pages/replicas.py").run()
    assert one.multiselect(key="f_replica").value == ["replica-02"]
    assert not one.exception and not one.success and not one.error
    assert [i.value.split(" (")[0] for i in one.info] == ["One replica in this range"]
    assert "replica-02" in one.info[0].value
    # one minute of the spike holds about 83 requests per replica, too few for a p99 to judge (the fewest is 100):
    # no replica is flagged (replica-05's p99 was, from a handful of its slowest requests), and no all clear either
    since = START_NS + 19 * 60 * 10**9
    brief = AppTest.from_file(str(APP), default_timeout=120)
    brief.query_params["since_ns"], brief.query_params["until_ns"] = str(since), str(since + 60 * 10**9)
    brief.switch_page("app_pages/replicas.py").run()
    assert not brief.exception and not brief.error and not brief.success
    (said,) = [w.value for w in brief.warning]
    assert said.startswith("Too few requests to judge: no replica of 8 holds the 100 requests a p99 needs")
    assert set(shown_tables(brief)[0]["outlier"]) == {"not judged"}
    # four minutes of the spike: about 330 requests a replica, judged, but each p99 rests on fewer than 5 requests
    # beyond it (fewer than 500 requests): the flag says so, and so does a note on the fleet; the full range does not
    assert not [i for i in at.info if "rests on" in i.value]
    short = AppTest.from_file(str(APP), default_timeout=120)
    short.query_params["since_ns"], short.query_params["until_ns"] = str(since - 10**11), str(since + 14 * 10**10)
    short.switch_page("app_pages/replicas.py").run()
    assert not short.exception
    rows = shown_tables(short)[0].set_index("replica")
    n = rows.loc["replica-05", "requests"]
    assert 100 <= int(n.replace(",", "")) < 500 and rows.loc["replica-05", "outlier"] == "yes"
    assert "**replica-05** (" in short.error[0].value
    assert f"; only {n} requests, so its p99 rests on fewer than 5 requests beyond it)" in short.error[0].value
    assert [i.value for i in short.info if "rests on" in i.value] == [
        "Every replica judged holds fewer than 500 requests: a p99 there rests on fewer than 5 requests beyond it, "
        "so one slow request moves it and a flag is weak evidence. A wider time range judges them on more."]


def test_shape_page_says_when_no_cell_can_be_trusted(incident_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole store names its slowest cell with a p99 to trust; one replica over five minutes (about 420
    requests) has no cell of 500 requests, and the page says so instead of leaving the line out."""
    at = _app(incident_store, monkeypatch)
    at.switch_page("app_pages/shape.py").run()
    assert [m for m in at.markdown if m.value.startswith("Slowest cell with a p99 to trust")]
    assert not [i for i in at.info if i.value.startswith("No cell holds")]
    since = START_NS + 19 * 60 * 10**9
    few = AppTest.from_file(str(APP), default_timeout=120)
    few.query_params["replica"] = "replica-02"
    few.query_params["since_ns"], few.query_params["until_ns"] = str(since), str(since + 300 * 10**9)
    few.switch_page("app_pages/shape.py").run()
    assert not few.exception and not [m for m in few.markdown if m.value.startswith("Slowest cell")]
    most = one(connect(incident_store),
        "SELECT max(n) FROM (SELECT count(*) AS n FROM requests WHERE replica = 'replica-02' AND start_ns >= ? AND "
        "start_ns < ? AND input_tokens IS NOT NULL AND output_tokens IS NOT NULL GROUP BY "
        "floor(log2(greatest(input_tokens, 1))), input_tokens = 0, floor(log2(greatest(output_tokens, 1))), "
        "output_tokens = 0)", [since, since + 300 * 10**9])[0]
    assert [i.value for i in few.info] == [
        f"No cell holds the 500 requests a p99 needs to be trusted (the most here: {most:,}): each cell's p99 rests on "
        "its few slowest requests, so the colours compare little. Widen the filters or the time range."]


def test_trace_search(incident_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(incident_store, monkeypatch)
    at.switch_page("app_pages/traces.py").run()
    con = connect(incident_store)
    try:
        tid, decode_ns, tokens_in, tokens_out, replica, tenant, status = con.execute(
            "SELECT trace_id, decode_ns, input_tokens, output_tokens, replica, tenant, status FROM requests "
            "ORDER BY e2e_ns LIMIT 1").fetchone() or ("", 0, 0, 0, "", "", "")
    finally:
        con.close()
    at.text_input(key="trace_id").input(tid.upper()).run()
    assert not at.exception
    assert at.subheader[0].value == f"Trace {tid}"  # the waterfall opens at the top, above the exemplars
    assert at.query_params["trace"] == tid  # and the trace is in the URL
    # the names in a line (a long one is not cut short in a metric's column), each token count a metric of its own
    assert f"replica **{replica}** · tenant **{tenant}** · status **{status}**" in [m.value for m in at.markdown]
    assert (_metric(at, "input tokens"), _metric(at, "output tokens")) == (f"{tokens_in:,}", f"{tokens_out:,}")
    table = shown_tables(at)[0]
    assert table.loc[table["stage"] == "decode", "on the critical path"].tolist() == [f"{decode_ns / 1e6:,.1f} ms"]
    at.text_input(key="trace_id").input("ffffffffffff").run()
    assert "No request with trace id" in at.error[0].value


def test_the_exemplars_stage_chart_draws_once_opened(incident_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The critical-path chart of the exemplars sits in a closed expander: drawn (coloured by stage) only once it is
    opened, the waterfall above it either way."""
    at = _app(incident_store, monkeypatch)
    at.switch_page("app_pages/traces.py").run()
    assert len(at.get("vega_lite_chart")) == 1  # the waterfall
    at.session_state["traces_stage_stack"] = True
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    _, stacks = (json.loads(c.proto.spec) for c in at.get("vega_lite_chart"))
    assert stacks["encoding"]["color"]["scale"]["domain"] == list(STAGE_COLORS)


def test_a_link_opens_its_trace_and_filters(incident_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """?trace=&replica= (a shared link, or an exemplar row's) opens that trace under those filters."""
    con = connect(incident_store)
    try:
        row = con.execute("SELECT trace_id, replica FROM requests ORDER BY e2e_ns LIMIT 1").fetchone()
        tid, replica = row or ("", "")
    finally:
        con.close()
    monkeypatch.setenv("TAILSCOPE_STORE", str(incident_store))
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.query_params["trace"] = tid
    at.query_params["replica"] = replica
    at.switch_page("app_pages/traces.py").run()
    assert not at.exception
    assert at.subheader[0].value == f"Trace {tid}"
    assert at.multiselect(key="f_replica").value == [replica]
    # the exemplars: a Markdown table, each row a link (its id's first 12 digits) to its own trace, same filters
    shown = next(t for t in shown_tables(at) if "replica" in t.columns)
    assert set(shown["replica"]) == {replica} and len(shown) > 1
    links = [re.fullmatch(r"\[([0-9a-f]{12})\]\((traces\?replica=[^)]*trace=([0-9a-f]{32}))\)", c)
             for c in shown["trace (opens the waterfall)"]]
    assert all(m is not None and m[3].startswith(m[1]) for m in links), list(shown["trace (opens the waterfall)"])
    assert len({m[3] for m in links if m}) == len(shown)


def test_sql_console_runs_a_select(incident_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(incident_store, monkeypatch)
    at.switch_page("app_pages/sql.py").run()
    at.text_area(key="sql_text").input("SELECT count(*) AS n FROM requests").run()
    at.button(key="sql_run").click().run()
    assert not at.error
    assert int(at.dataframe[0].value["n"].iloc[0]) == REQUESTS


@pytest.mark.parametrize("query", [
    "COPY (SELECT 1) TO '/tmp/tailscope-should-not-exist.csv'",
    "ATTACH '/tmp/tailscope-should-not-exist.db'",
    "INSTALL httpfs",
    "CREATE TABLE x AS SELECT 1",
    "SELECT 1; SELECT 2",
    "SELECT * FROM read_csv('/etc/passwd')",
])
def test_sql_console_refuses_writes_and_file_access(incident_store: Path, monkeypatch: pytest.MonkeyPatch,
                                                    query: str) -> None:
    at = _app(incident_store, monkeypatch)
    at.switch_page("app_pages/sql.py").run()
    at.text_area(key="sql_text").input(query).run()
    at.button(key="sql_run").click().run()
    assert not at.exception
    assert at.error, f"{query!r} was not refused"
    assert not at.dataframe
    assert not Path("/tmp/tailscope-should-not-exist.csv").exists()


def test_whatif_fewer_replicas_predicts_a_worse_tail(incident_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(incident_store, monkeypatch)
    at.switch_page("app_pages/whatif.py").run()
    assert not at.exception and not at.warning
    spike = next(o for o in at.selectbox(key="whatif_window").options if o.startswith("spike"))
    # one clock, named as the Overview's banners name it
    assert re.fullmatch(r"spike \d\d:\d\d:\d\d–\d\d:\d\d:\d\d UTC", spike), spike
    # the headline names the window its batch relation is measured over (Capacity's is the whole range)
    assert any(f"Measured and replayed over the {spike}".replace(":", "\\:") in m.value for m in at.info)
    same = _metric(at, "replay, 8 replicas (as observed)")
    assert _metric(at, "predicted, 8 replicas") == same
    at.slider(key="whatif_replicas").set_value(1).run()
    assert not at.exception
    assert _metric(at, "predicted, 1 replica") != same
    # the whole range: the prediction is analysis.capacity.predict_at's (the Capacity page's replay), its
    # assumption about service time against the batch stated first in the headline
    from analysis.capacity import observed_workload, predict_at
    from dashboard.charts import fmt_ms

    at.selectbox(key="whatif_window").set_value("the whole filtered range").run()
    assert not at.exception
    w = observed_workload(connect(incident_store))
    want = predict_at(w, 1, w.slots)
    assert _metric(at, "predicted, 1 replica") == f"{fmt_ms(want['p50_ms'])} / {fmt_ms(want['p99_ms'])}"
    heads = [m.value for m in at.info if m.value.startswith("If ")]
    assert heads and heads[0].startswith(f"If {want['service']['assumption']}, 1 replica × {w.slots} slots"), heads
    assert (want["fixed"] is None) == ("would say" not in heads[0])
    # the window its batch relation is measured over: the first arrival to the last
    assert "Measured and replayed over the whole filtered range, 07\\:00\\:00–07\\:29\\:59 UTC" in heads[0], heads


@pytest.mark.parametrize("page", PAGES)
def test_pages_run_while_critical_paths_are_pending(incident_store: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch, page: str) -> None:
    """A big store first shows request facts; every page must work before the stage columns exist."""
    import shutil

    from dashboard import data

    store = tmp_path / "store"
    shutil.copytree(incident_store, store)  # a new path: a new workbench
    monkeypatch.setattr(data, "QUICK_LOAD_BYTES", 0)
    monkeypatch.setattr(data.Workbench, "_start_worker", lambda self: None)  # keep the hours pending
    at = _app(store, monkeypatch)
    at.switch_page(page).run()
    assert not at.exception, [e.message for e in at.exception]
    if page == "app_pages/overview.py":
        assert _metric(at, "requests") == f"{REQUESTS:,}"
        assert int(_metric(at, "spikes")) >= 1


def test_sql_console_example_runs(incident_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(incident_store, monkeypatch)
    at.switch_page("app_pages/sql.py").run()
    at.selectbox(key="sql_example").select("p50 / p99 per replica").run()
    assert (at.text_area(key="sql_text").value or "").startswith("SELECT replica")
    at.button(key="sql_run").click().run()
    assert not at.error and not at.exception
    table = at.dataframe[0].value
    assert sorted(table["replica"]) == [f"replica-{i:02d}" for i in range(8)]
    assert int(table["requests"].sum()) == REQUESTS
    assert table.iloc[0]["replica"] == "replica-05"  # ordered by p99, slowest first


ALL_PAGES = (*PAGES, "app_pages/alerts.py", "app_pages/capacity.py", "app_pages/cost.py")
_RAW = re.compile(r"(?<![\w.])(None|nan|NaN)(?![\w.])|\d\.\d{4,}")
#: What Streamlit 1.67's Markdown takes for an emoji shortcode (its frontend's test before it loads remark-emoji)
_SHORTCODE = re.compile(r":(?!material/|streamlit:)[\w+-][\w_+-]*:")


def test_every_table_and_sentence_reads_as_numbers_for_people(incident_store: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """On every page: each float column of a grid has a display format, headers are words (no snake_case),
    no cell holds None / nan (a static table's cells, as shown, read neither), and no sentence or metric reads
    None, nan or a float with 4+ decimals."""
    at = _app(incident_store, monkeypatch)
    for page in ALL_PAGES:
        at.switch_page(page).run()
        assert not at.exception, (page, [e.message for e in at.exception])
        for frame in at.dataframe:
            config = json.loads(frame.proto.columns or "{}")
            df = frame.value
            for col in df.columns:
                shown = config.get(str(col), {})
                label = shown.get("label") or str(col)
                assert "_" not in label, (page, label)
                if df[col].dtype.kind == "f":
                    assert shown.get("type_config", {}).get("format"), (page, col, "a float column without a format")
                if df[col].dtype == object:
                    assert not df[col].map(lambda v: v is None or (isinstance(v, float) and v != v)).any(), (page, col)
        for shown in shown_tables(at):  # a Markdown table (dashboard.formats.table): its headers and cells as read
            assert not [c for c in shown.columns if "_" in c], (page, list(shown.columns))
            for cell in shown.to_numpy().ravel():
                assert not _RAW.search(cell), (page, cell)
        texts = [m.value for m in (*at.markdown, *at.caption, *at.info, *at.warning, *at.error, *at.success)]
        texts += [str(m.value) for m in at.metric]
        for text in texts:
            assert not _RAW.search(str(text)), (page, text)
        # no Markdown text (the sidebar's too) holds what Streamlit's Markdown takes for an emoji shortcode, which
        # makes a page load its emoji plugin (about 260 KB of script): a clock time's `14:06:00` did
        for md in (*at.markdown, *at.caption, *at.info, *at.warning, *at.error, *at.success):
            assert not _SHORTCODE.search(md.value), (page, md.value)
