"""AppTest: the Cost and Capacity pages run, and show what analysis.cost / analysis.capacity compute."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

from analysis.capacity import capacity_curve, observed_workload, scale_up
from analysis.cost import Prices, cost_table
from analysis.engine.connect import connect
from analysis.stats.batching import service_vs_batch
from dashboard import data
from dashboard.charts import AXIS_CLOCK, clock, fmt_ms
from dashboard.formats import usd_metric
from tests.dashboard.conftest import APP, shown_tables
from tests.dashboard.incident_store import START_NS
from tests.sql import one


def _app(store: Path, monkeypatch: pytest.MonkeyPatch, page: str) -> AppTest:
    monkeypatch.setenv("TAILSCOPE_STORE", str(store))
    at = AppTest.from_file(str(APP), default_timeout=300)
    at.run()
    at.switch_page(page).run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def _metric(at: AppTest, label: str) -> str:
    values = [m.value for m in at.metric if m.label == label]
    assert values, f"no metric {label!r} among {[m.label for m in at.metric]}"
    return str(values[0])


@pytest.mark.parametrize("page", ["app_pages/cost.py", "app_pages/capacity.py"])
def test_pages_explain_an_empty_store(empty_store: Path, monkeypatch: pytest.MonkeyPatch, page: str) -> None:
    at = _app(empty_store, monkeypatch, page)
    assert not at.error and at.info


def _cell_ns(area: dict) -> int:
    """The Cost chart's cell (ns), read from its tooltip's title as the page states it."""
    title = area["encoding"]["tooltip"][-1]["title"]
    cell = re.fullmatch(r"GPU seconds in the (\d+) s", title)
    assert cell is not None, title
    return int(cell[1]) * 10**9


def test_cost_page_shows_the_cost_table(incident_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(incident_store, monkeypatch, "app_pages/cost.py")
    want = cost_table(connect(incident_store), by="tenant", prices=Prices(default=2.0))
    assert _metric(at, "GPU-hours allocated") == f"{want['totals']['allocated_ns'] / 3.6e12:,.2f}"
    assert _metric(at, "idle share") == f"{want['totals']['idle_share']:.1%}"
    # no price yet: the metric's value fits its column, its help names the docs
    assert _metric(at, "cost") == _metric(at, "idle + cold start") == "set a price"
    assert [m.help for m in at.metric if m.label == "cost"] == ["set a price (docs/cost.md)"]
    at.number_input(key="cost_price").set_value(2.0).run()
    assert not at.exception
    assert _metric(at, "cost") == f"${want['totals']['allocated_usd']:,.2f}"
    table = shown_tables(at)[0]  # a Markdown table: each tenant's GPU seconds as a reader sees them
    assert dict(zip(table["tenant"], table["GPU seconds"], strict=True)) == {
        r["key"]: f"{r['gpu_ns'] / 1e9:,.1f}" for r in want["rows"]}
    assert sum(r["gpu_ns"] for r in want["rows"]) == want["totals"]["allocated_ns"]
    # the chart over time sits in a closed expander: sent and drawn only once it is opened
    assert not at.get("vega_lite_chart") and not [c for c in at.caption if c.value.startswith("Not drawn")]
    at.session_state["cost_over_time"] = True
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    # the time axis labels each tick by its granularity (a fixed HH:MM repeats itself at 30 s ticks)
    (chart,) = [c for c in at.get("vega_lite_chart") if "\"area\"" in c.proto.spec]
    area = json.loads(chart.proto.spec)
    assert area["encoding"]["x"]["axis"]["format"] == AXIS_CLOCK
    # no part-filled last cell read as a drop: the chart's cells end with the one holding the last arrival, and the
    # caption names what is left out (requests still running after it)
    con = connect(incident_store)
    last_ns, end_ns = con.execute("SELECT max(start_ns), max(end_ns) FROM requests").fetchone() or (0, 0)
    cell_ns = _cell_ns(area)
    drawn = set(pa.ipc.open_stream(chart.proto.datasets[0].data.data).read_all().column("bucket_ns").to_pylist())
    assert max(drawn) == last_ns // cell_ns * cell_ns and end_ns > max(drawn) + cell_ns
    (note,) = [c.value for c in at.caption if c.value.startswith("Not drawn")]
    assert f"from {clock(max(drawn) + cell_ns)} UTC on".replace(":", "\\:") in note
    at.radio(key="cost_by").set_value("replica").run()
    assert not at.exception
    assert len(shown_tables(at)[0]) == len(want["replicas"])


def test_capacity_page_finds_the_fewest_replicas(incident_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the curve computed in the background, as from BACKGROUND_REQUESTS requests: the page waits for it in the same
    # run and draws it, with no note left
    monkeypatch.setattr(data, "BACKGROUND_REQUESTS", 1)
    at = _app(incident_store, monkeypatch, "app_pages/capacity.py")
    assert not [m for m in at.info if "stay usable" in m.value]
    at.number_input(key="cap_target").set_value(60_000.0).run()
    assert not at.exception
    w = observed_workload(connect(incident_store))
    answer = capacity_curve(w, range(1, 65), target_p99_ms=60_000.0)
    want = answer["fewest_replicas"]
    assert want is not None
    assert _metric(at, "fewest replicas for the target") == str(want)
    said = answer["advice"]["sentence"]  # scale down / up / keep against the observed replicas, in words
    svc = answer["service"]
    # the headline states the replay's assumption about service time against the batch, then the advice
    texts = [m.value for m in (*at.info, *at.warning) if m.value.startswith("If ")]
    heads = [t for t in texts if "reactive scale-up" not in t]
    assert heads and heads[0].startswith(f"If {svc['assumption']}, {said}."), heads
    # the window its batch relation is measured over: the first arrival to the last
    assert "Measured and replayed over the whole filtered range, 07\\:00\\:00–07\\:29\\:59 UTC" in heads[0], heads
    # the scale-up comparison below it replays the same way (analysis.capacity.scale_up) and says so first
    up = scale_up(w, max(1, want // 2), want)
    ups = [t for t in texts if "reactive scale-up" in t]
    assert ups and ups[0].startswith(
        f"If {svc['assumption']}, reactive scale-up from {max(1, want // 2)} to {want} replicas gives p99 "
        f"{fmt_ms(up['reactive']['p99_ms'])} (adding {up['reactive']['added']})"), ups
    assert up["service"]["assumption"] == svc["assumption"]
    rel = service_vs_batch(connect(incident_store))
    if rel is None:
        assert not svc["batch_relation_applied"] and "cannot show how service time changes" in heads[0]
    else:
        assert svc["batch_relation_applied"] == rel["shown"]
        assert f"{rel['growth_per_request']:+.1%} per request of batch" in heads[0]
    if svc["batch_relation_applied"]:
        lo, hi = svc["fewest_interval"]
        assert f"{lo}–{hi} replicas" in heads[0] and lo <= want <= hi
        assert f"would say {svc['fixed_fewest_replicas']} replicas" in heads[0]
    at.number_input(key="cap_target").set_value(20_000.0).run()
    tighter = capacity_curve(w, range(1, 65), target_p99_ms=20_000.0)["fewest_replicas"]
    shown = _metric(at, "fewest replicas for the target")
    assert shown == ("none of 1–64" if tighter is None else str(tighter))
    assert tighter is None or tighter >= want
    assert shown_tables(at), "the scale-up comparison is drawn"


def test_cost_page_says_what_a_filter_narrows(incident_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under tenant = acme the sweep is still the fleet's: grouped by tenant, the headline GPU-hours are acme's (the
    fleet's in its help, the idle figures named the fleet's); grouped by model, a note says the filter does not
    narrow the GPU time."""
    monkeypatch.setenv("TAILSCOPE_STORE", str(incident_store))
    at = AppTest.from_file(str(APP), default_timeout=300)
    # a range from 7:03:17 to 7:21:17: its first and last cells are partly observed, and drawn at the fleet's rate
    since, until = START_NS + 197 * 10**9, START_NS + 1_277 * 10**9
    at.query_params["tenant"] = "acme"
    at.query_params["since_ns"], at.query_params["until_ns"] = str(since), str(until)
    at.session_state["cost_over_time"] = True  # the chart's expander opened
    at.switch_page("app_pages/cost.py").run()
    assert not at.exception, [e.message for e in at.exception]
    want = cost_table(connect(incident_store), by="tenant", since=since, until=until)
    (chart,) = [c for c in at.get("vega_lite_chart") if "\"area\"" in c.proto.spec]
    drawn = pa.ipc.open_stream(chart.proto.datasets[0].data.data).read_all().to_pandas()
    cell_ns = _cell_ns(json.loads(chart.proto.spec))
    assert (drawn["bucket_ns"].min(), drawn["bucket_ns"].max()) == (since // cell_ns * cell_ns,
                                                                    (until - 1) // cell_ns * cell_ns)
    assert not [c for c in at.caption if c.value.startswith("Not drawn")]
    (acme,) = [r for r in want["rows"] if r["key"] == "acme"]
    assert _metric(at, "GPU-hours allocated (tenant filtered)") == f"{acme['gpu_ns'] / 3.6e12:,.2f}"
    assert [m.help for m in at.metric if m.label.startswith("GPU-hours")] == [
        f"The fleet's, over the range: {want['totals']['allocated_ns'] / 3.6e12:,.2f} GPU-hours."]
    assert _metric(at, "fleet idle share") == f"{want['totals']['idle_share']:.1%}"
    assert list(shown_tables(at)[0]["tenant"]) == ["acme"] and not [i for i in at.info if "whole fleet" in i.value]
    # priced, the filtered cost is analysis' total of acme's rows
    at.number_input(key="cost_price").set_value(2.0).run()
    priced = cost_table(connect(incident_store), by="tenant", since=since, until=until, prices=Prices(default=2.0),
                        keys=["acme"])["selected"]
    assert priced["allocated_ns"] == acme["gpu_ns"] and priced["allocated_usd"] is not None
    assert _metric(at, "cost") == usd_metric(priced["allocated_usd"])[0]
    at.number_input(key="cost_price").set_value(0.0).run()
    at.radio(key="cost_by").set_value("model").run()
    assert not at.exception
    assert [i.value for i in at.info if "whole fleet" in i.value] == [
        "GPU time is shared out over the whole fleet in the time range\\: tenant = acme does not narrow it here. Group "
        "by tenant to read its share."]
    assert _metric(at, "GPU-hours allocated") == f"{want['totals']['allocated_ns'] / 3.6e12:,.2f}"


def test_capacity_target_defaults_to_a_p99_the_observed_fleet_meets(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """200 requests one after the other on one replica, p99 1,000.298 ms: the replay reproduces it at any count, so
    the default target (the observed p99 in whole ms, rounded up) is met by one replica. Rounded to the nearest ms
    (1,000) no count met it and the page said so of the traffic the fleet had just served."""
    from tests.factory import add_request, write
    from tracing.rows import SpanBatch

    batch, ms = SpanBatch(), 1_000_000
    for i in range(200):
        e2e = {197: 1_000_200_000, 198: 1_010 * ms, 199: 1_020 * ms}.get(i, 1_000 * ms)
        add_request(batch, i, i * 2_000 * ms, i * 2_000 * ms + e2e, [("generation", i * 2_000 * ms,
                                                                        i * 2_000 * ms + e2e)])
    write(tmp_path, batch)
    p99 = one(connect(tmp_path), "SELECT quantile_cont(e2e_ns, 0.99) / 1e6 FROM requests")[0]
    assert p99 == pytest.approx(1_000.298) and round(p99) < p99
    at = _app(tmp_path, monkeypatch, "app_pages/capacity.py")
    assert at.number_input(key="cap_target").value == 1_001.0
    assert _metric(at, "fewest replicas for the target") == "1"


def test_the_warm_up_keeps_the_live_hours_sweep_for_the_cost_page(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Three hours, the last one live beside two materialized: the warm-up sweeps the unfiltered Cost page's live runs
    once, after the server may answer; the page's job then sweeps nothing and gives what a cost over the store gives,
    and a refresh that brings new spans empties what was kept."""
    from analysis.cost import cost_page
    from analysis.engine import gpu_sweep as GS
    from analysis.engine.materialize import materialize
    from tests.factory import T0, add_request, write
    from tracing.rows import SpanBatch

    s, h = 10**9, 3600 * 10**9
    batch = SpanBatch()
    for i in range(3 * 60):  # a request a minute on two replicas, some crossing an hour's edge
        start = i * 60 * s + (i % 7) * s
        add_request(batch, i, start, start + 90 * s, [("generation", start + s, start + 80 * s)],
                    replica=f"r{i % 2}", attrs={"tailscope.tenant": "ab"[i % 3 == 0]})
    write(tmp_path, batch)
    materialize(tmp_path, settled_before_ns=T0 + 3 * h)  # the last hour stays live
    wb = data.Workbench(tmp_path)
    wb.refresh()
    assert wb.live_requests and wb.stored_requests
    wb.warm()
    assert wb.warmer is not None
    wb.warmer.join(120)
    assert wb.warmed.is_set() and wb.cost_warm is not None
    wb.cost_warm.result(120)
    bucket = data.cost_bucket_s(wb, str(wb.store), wb.version, data.Filters())
    assert (T0 + 2 * h, 2**62, bucket * s) in wb.cost_runs
    want = cost_page(connect(tmp_path), by="tenant", bucket_s=bucket, prices=Prices(default=2.0))

    def no_sweep(*a: object, **k: object) -> None:
        raise AssertionError("swept again")

    with monkeypatch.context() as m:
        m.setattr(GS, "run_sweep", no_sweep)
        res, series = wb.cost_page(data.Filters(), "tenant", 2.0, bucket)
    assert res == want[0] and series.equals(want[1].to_pandas())
    more = SpanBatch()
    add_request(more, "late", 3 * h - 30 * s, 3 * h - 10 * s, [("generation", 3 * h - 29 * s, 3 * h - 11 * s)])
    write(tmp_path, more)
    assert wb.refresh() and not wb.cost_runs


def test_the_capacity_pages_work_started_with_its_html_is_the_pages_own(incident_store: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The unfiltered Capacity page's work, started when a browser asks for its HTML (data.start_page_work), is the
    page's own: the page then replays and reads nothing (every replay and read of the workload fails from there) and
    shows the curve and the scale-up comparison at its defaults. Other pages start nothing, nor does a store whose
    critical paths are still being computed."""
    import shutil

    store = tmp_path / "store"  # a path of its own: a workbench (cache_resource) not opened by another test
    shutil.copytree(incident_store, store)
    monkeypatch.setattr(data.Workbench, "warm_capacity", lambda self: None)  # only the page's HTML starts it here
    wb = data.workbench(str(store.resolve()))
    assert wb.warmed.wait(300) and wb.capacity_warm is None
    assert data.start_page_work(wb, "spike") is None and data.start_page_work(wb, "") is None
    wb.pending = {0}  # critical paths still to compute: the page replays nothing yet, so nothing starts
    assert data.start_page_work(wb, "capacity") is None
    wb.pending = set()
    job = data.start_page_work(wb, "capacity")
    assert job is not None
    job.result(300)
    _capacity_page_computes_nothing(store, wb, monkeypatch)


def test_the_warm_up_computes_the_capacity_page_last(incident_store: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A store opened ready: after the Overview, the report and the Cost page's sweep, the warm-up computes the
    unfiltered Capacity page (curve and scale-up at its defaults), which then computes nothing of its own."""
    import shutil

    store = tmp_path / "store"  # a path of its own: a workbench (cache_resource) not opened by another test
    shutil.copytree(incident_store, store)
    wb = data.workbench(str(store.resolve()))
    assert wb.warmed.wait(300)
    for step in (wb.cost_warm, wb.capacity_warm):
        assert step is not None
        step.result(300)
    _capacity_page_computes_nothing(store, wb, monkeypatch)


def _capacity_page_computes_nothing(store: Path, wb: data.Workbench, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Capacity page over `store`, every replay and workload read failing: it shows what analysis.capacity gives
    at its defaults (the curve's fewest count, the scale-up comparison), read from the caches."""
    import analysis.capacity as C

    w = observed_workload(connect(store))
    key, f = (wb, str(wb.store), wb.version), data.Filters()
    target = data.capacity_target(data.summary(*key, f), "e2e")
    want = capacity_curve(w, range(1, 65), target_p99_ms=target)
    start, top = data.scale_up_counts(want)
    up = scale_up(w, start, top)

    def no_work(*a: object, **k: object) -> None:
        raise AssertionError("computed again")

    for name in ("capacity_curve", "scale_up", "observed_workload", "replay_batched", "replay"):
        monkeypatch.setattr(C, name, no_work)
    at = _app(store.resolve(), monkeypatch, "app_pages/capacity.py")
    assert at.number_input(key="cap_target").value == target
    assert _metric(at, "fewest replicas for the target") == ("none of 1–64" if want["fewest_replicas"] is None
                                                             else str(want["fewest_replicas"]))
    assert (at.number_input(key="cap_start").value, at.number_input(key="cap_top").value) == (start, top)
    ups = [m.value for m in at.info if "reactive scale-up" in m.value]
    assert ups and f"gives p99 {fmt_ms(up['reactive']['p99_ms'])} (adding {up['reactive']['added']})" in ups[0]


@pytest.mark.parametrize("page", ["app_pages/capacity.py", "app_pages/whatif.py"])
def test_a_replay_page_says_when_no_request_matches_the_filters(incident_store: Path,
                                                                 monkeypatch: pytest.MonkeyPatch, page: str) -> None:
    """A time range before the first request: the page says there is nothing to replay and replays nothing."""
    import analysis.capacity as C

    def no_work(*a: object, **k: object) -> None:
        raise AssertionError("replayed")

    monkeypatch.setattr(C, "observed_workload", no_work)
    monkeypatch.setenv("TAILSCOPE_STORE", str(incident_store))
    at = AppTest.from_file(str(APP), default_timeout=300)
    at.query_params["since_ns"], at.query_params["until_ns"] = str(START_NS - 600 * 10**9), str(START_NS - 10**9)
    at.switch_page(page).run()
    assert not at.exception, [e.message for e in at.exception]
    assert [i.value for i in at.info if "nothing to replay" in i.value] == [
        "No requests match the filters: nothing to replay."]


def test_the_cost_pages_work_started_with_its_html_is_the_pages_own(incident_store: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """As the Capacity page's: the unfiltered Cost page's work started early (data.start_page_work) is the page's
    own table and series, so the page computes no cost of its own and shows the table analysis.cost gives."""
    import shutil

    import analysis.cost as AC

    store = tmp_path / "store"  # a path of its own: a workbench (cache_resource) not opened by another test
    shutil.copytree(incident_store, store)
    wb = data.workbench(str(store.resolve()))
    assert wb.warmed.wait(300)
    job = data.start_page_work(wb, "cost")
    assert job is not None
    job.result(300)
    want = cost_table(connect(store), by="tenant")

    def no_work(*a: object, **k: object) -> None:
        raise AssertionError("computed again")

    for name in ("cost_page", "cost_table", "cost_series"):
        monkeypatch.setattr(AC, name, no_work)
    at = _app(store.resolve(), monkeypatch, "app_pages/cost.py")
    assert not at.warning, [w.value for w in at.warning]
    assert _metric(at, "GPU-hours allocated") == f"{want['totals']['allocated_ns'] / 3.6e12:,.2f}"
    table = shown_tables(at)[0]
    assert dict(zip(table["tenant"], table["GPU seconds"], strict=True)) == {
        r["key"]: f"{r['gpu_ns'] / 1e9:,.1f}" for r in want["rows"]}


def test_a_burst_of_html_requests_queues_a_pages_work_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever a client sends, a page's early work (data.start_page_work) is queued once while it is queued or
    running: a thousand requests for the page's HTML return the same job, which runs once; another store's page gets
    its own job; once a job is done, the next request starts the work again."""
    import threading
    from types import SimpleNamespace
    from typing import cast

    gate, runs = threading.Event(), []

    def work(db: object) -> None:
        runs.append(db)
        assert gate.wait(60)

    monkeypatch.setitem(data.PAGE_WORK, "capacity", work)
    db, other = (cast(data.Bench, SimpleNamespace(pending=set())) for _ in range(2))
    try:
        jobs = [data.start_page_work(db, "capacity") for _ in range(1000)]
        first = jobs[0]
        assert first is not None and all(job is first for job in jobs)
        theirs = data.start_page_work(other, "capacity")
        assert theirs is not None and theirs is not first
    finally:
        gate.set()  # a failure above leaves no job waiting on the gate
    first.result(60)
    theirs.result(60)
    again = data.start_page_work(db, "capacity")
    assert again is not None and again is not first
    again.result(60)
    assert [r is db for r in runs] == [True, False, True]
