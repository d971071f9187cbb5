"""The dashboard on ClickHouse (chdb) shows what it shows on the store: same spikes, explanations, series, traces.

A catalogue sample is ingested into a store and exported into an otel_traces table; the
dashboard's data functions run on the store's Workbench and on the ClickHouse bench and are
compared, unfiltered and under filters. Then every page runs on ClickHouse (AppTest): the
supported ones render the analysis, the others say in one sentence that they need a store.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from analysis import clickhouse as C
from analysis.clickhouse.export import export_store
from dashboard import clickhouse_data as CHD
from dashboard import data
from dashboard.settings import ENV_DSN, ENV_ENGINE
from tests import samples_cache
from tests.analysis.clickhouse_releases import older_releases, serve
from tests.clickhouse_memo import Memo
from tests.dashboard.conftest import APP, shown_tables

# ClickHouse (chdb) end to end on catalogue samples (make test-fast leaves it out)
pytestmark = pytest.mark.slow

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "data" / "incidents" / "slow_replica.otlp.jsonl.gz"
MINUTE = 60_000_000_000


class _On(TypedDict):
    """The first three arguments of every data function: the engine, its store's name and its data version."""

    _db: data.Bench
    store: str
    version: int


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(the store, the chdb DSN of the same spans in otel_traces); the chdb session is closed again."""
    root = tmp_path_factory.mktemp("chdash")
    store = samples_cache.copy(SAMPLE, tmp_path_factory, root / "store")  # the workbench may materialize hours
    dsn = f"chdb:{root / 'ch'}"
    client = C.open_client(dsn)
    try:
        export_store(store, client, C.DEFAULT_TABLE)
    finally:
        client.close()
    return store, dsn


@pytest.fixture(scope="module")
def benches(exported: tuple[Path, str]) -> Iterator[tuple[data.Workbench, CHD.ClickHouseBench]]:
    store, dsn = exported
    ch = data.clickhouse_bench(dsn, C.DEFAULT_TABLE)
    ch.client = Memo(ch.client)  # the data functions' repeated statements answered once (tests/clickhouse_memo.py)
    yield data.workbench(str(store)), ch
    ch.close()  # one chdb engine per process: let later tests open their own
    data.clickhouse_bench.clear()


def _same(got: Any, want: Any) -> None:
    """Equal, floats within rounding (the engines interpolate a quantile in a different order)."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys()
        for k in want:
            _same(got[k], want[k])
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            _same(a, b)
    elif isinstance(want, float) and want == want:
        assert got == pytest.approx(want, rel=1e-12)
    else:
        assert got == want or (got != got and want != want)


def _frames(got: pd.DataFrame, want: pd.DataFrame, drop: tuple[str, ...] = ()) -> None:
    cols = [c for c in want.columns if c not in drop]
    assert set(cols) <= set(got.columns)
    pd.testing.assert_frame_equal(got[cols].reset_index(drop=True), want[cols].reset_index(drop=True),
                                  check_dtype=False, rtol=1e-12)


def _filters(wb: data.Workbench) -> list[data.Filters]:
    c = data.choices(wb, str(wb.store), wb.version)
    return [data.Filters(), data.Filters(replica=("replica-05", "replica-07", "replica-11")),
            data.Filters(since_ns=c["min_ns"] + 2 * MINUTE, until_ns=c["max_ns"] - MINUTE)]


def _by_attributes(wb: data.Workbench) -> data.Filters:
    """Two attribute filters at once: a node (resource) and two values of a request key."""
    choices = data.attribute_choices(wb, str(wb.store), wb.version)
    node, (key, entry) = "k8s.node.name", next((k, e) for k, e in choices.items() if e["source"] == "request")
    return data.Filters(attributes=(data.attribute_filter(choices, node, tuple(choices[node]["values"][:2])),
                                    data.attribute_filter(choices, key, tuple(entry["values"][:2]))))


def _agree_on_attributes(wb: data.Workbench, ch: CHD.ClickHouseBench, every_key: bool = True) -> None:
    """The attributes offered, the requests each filter keeps (one attribute, or two at once: every page's
    breakdowns and the report under them) and each grouping's counts are the same on both engines (`every_key`:
    each key filtered and grouped alone too; else only the two at once, which run every SQL text)."""
    kw: _On = {"_db": wb, "store": str(wb.store), "version": wb.version}
    kc: _On = {"_db": ch, "store": ch.store, "version": ch.version}
    choices = data.attribute_choices(**kw)
    assert ch.can("attribute_filters") and "k8s.node.name" in choices
    assert data.attribute_choices(**kc) == choices
    for key, entry in choices.items() if every_key else ():
        f = data.Filters(attributes=(data.attribute_filter(choices, key, tuple(entry["values"][:1])),))
        _same(data.summary(**kc, filters=f), data.summary(**kw, filters=f))
        _frames(data.by_attribute(**kc, filters=data.Filters(), metric="e2e", key=key),
                data.by_attribute(**kw, filters=data.Filters(), metric="e2e", key=key))
    f = _by_attributes(wb)
    assert 0 < data.summary(**kw, filters=f)["requests"] < data.summary(**kw, filters=data.Filters())["requests"]
    _same(data.summary(**kc, filters=f), data.summary(**kw, filters=f))
    assert data.report_of(**kc, filters=f) == data.report_of(**kw, filters=f)
    _frames(data.replicas(**kc, filters=f, metric="e2e"), data.replicas(**kw, filters=f, metric="e2e"))
    _frames(data.shape(**kc, filters=f, metric="e2e"), data.shape(**kw, filters=f, metric="e2e"))
    _frames(data.exemplars(**kc, filters=f, limit=20), data.exemplars(**kw, filters=f, limit=20), drop=("start",))
    _frames(data.by_attribute(**kc, filters=f, metric="e2e", key="k8s.node.name"),
            data.by_attribute(**kw, filters=f, metric="e2e", key="k8s.node.name"))


def test_the_data_functions_agree_on_both_engines(benches: tuple[data.Workbench, CHD.ClickHouseBench]) -> None:
    _agree(*benches)
    _agree_on_attributes(*benches)


def test_an_attribute_filter_set_is_computed_once(benches: tuple[data.Workbench, CHD.ClickHouseBench]) -> None:
    """Under attribute filters every query reads the one session table of their requests (made once per data
    version and filter set), and the report, the counts and the exemplars equal those of the filters' own
    subqueries written into each query."""
    from analysis.clickhouse import breakdowns as CB
    from analysis.clickhouse import report as CR
    from dashboard.engine import FILTER_DIMENSIONS

    wb, ch = benches
    f = _by_attributes(wb)
    name = CHD._matching(ch, f.attributes)
    made = ch.made
    inline = (f"{CB.condition(None, None, {})} AND "
              f"{CB.attribute_condition(f.attributes, CHD.FACTS, ch.table)}")
    got = CHD.report(ch, f, FILTER_DIMENSIONS, "e2e")
    want = CR.build_report(ch.client, ch.table, metric="e2e", include_failures=True, facts=CHD.FACTS, where=inline)
    assert got == want and got["requests"] > 0
    _same(CHD.summary(ch, f, FILTER_DIMENSIONS), CB.summary(ch.client, CHD.FACTS, inline))
    _frames(CHD.exemplars(ch, f, FILTER_DIMENSIONS, 20, "e2e", None),
            CB.slowest(ch.client, CHD.FACTS, "e2e", 20, inline).to_pandas())
    assert ch.matches[(ch.version, f.attributes)] == name and ch.made == made  # the same table, not made again


@pytest.fixture(scope="module", params=older_releases())
def served_bench(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                 exported: tuple[Path, str]) -> Iterator[tuple[data.Workbench, CHD.ClickHouseBench]]:
    """The store's workbench and the bench of the same spans on an older release, over HTTP (the real client)."""
    store = exported[0]
    with serve(str(request.param), tmp_path_factory.mktemp("chdash-http")) as srv:
        client = C.open_client(srv.dsn)
        try:
            export_store(store, client, C.DEFAULT_TABLE)
        finally:
            client.close()
        ch = CHD.open_bench(srv.dsn, C.DEFAULT_TABLE)
        ch.client = Memo(ch.client)  # every distinct statement runs on the release, a repeated one once
        try:
            yield data.workbench(str(store)), ch
        finally:
            ch.close()


def test_the_data_functions_agree_on_the_older_releases(served_bench: tuple[data.Workbench, CHD.ClickHouseBench]
                                                        ) -> None:
    """The same calls through clickhouse:// on each older release (tests/clickhouse_http.py): every breakdown,
    cost, what-if, capacity and trace query of the dashboard runs there with the same answers. Unfiltered only:
    a filter adds `start_ns` bounds and `IN` lists to the same SQL (clickhouse.breakdowns.condition)."""
    _agree(*served_bench, filters=[data.Filters()])
    _agree_on_attributes(*served_bench, every_key=False)


def _agree(wb: data.Workbench, ch: CHD.ClickHouseBench, filters: list[data.Filters] | None = None) -> None:
    """Every data function of the dashboard gives the same on the store's workbench and on the ClickHouse bench
    (under `filters`, by default unfiltered, three replicas and a time range)."""
    kw: _On = {"_db": wb, "store": str(wb.store), "version": wb.version}
    kc: _On = {"_db": ch, "store": ch.store, "version": ch.version}
    assert data.choices(**kc) == data.choices(**kw)
    spikes_seen = 0
    for f in filters if filters is not None else _filters(wb):
        _same(data.summary(**kc, filters=f), data.summary(**kw, filters=f))
        report = data.report_of(**kw, filters=f)
        assert data.report_of(**kc, filters=f) == report
        assert data.window_s(**kc, filters=f) == data.window_s(**kw, filters=f) == report["window_s"]
        _frames(data.over_time(**kc, filters=f).to_pandas(), data.over_time(**kw, filters=f).to_pandas())
        for metric in ("e2e", "ttft"):
            _frames(data.replicas(**kc, filters=f, metric=metric), data.replicas(**kw, filters=f, metric=metric))
            _frames(data.shape(**kc, filters=f, metric=metric), data.shape(**kw, filters=f, metric=metric))
        for replicas, slots in ((1, 4), (4, 4), (3, 6)):  # the queue replay of What-if
            _same(data.whatif(**kc, filters=f, replicas=replicas, slots=slots),
                  data.whatif(**kw, filters=f, replicas=replicas, slots=slots))
        assert data.whatif(**kc, filters=f, replicas=1, slots=4)["p99_ms"] is not None
        _same(data.capacity_curve(**kc, filters=f, target_p99_ms=30_000.0, metric="e2e", gpu_hour_usd=2.0,
                                  max_replicas=24),
              data.capacity_curve(**kw, filters=f, target_p99_ms=30_000.0, metric="e2e", gpu_hour_usd=2.0,
                                  max_replicas=24))
        for by in ("tenant", "replica"):  # the Cost page: the GPU-time sweep on the server
            cost = data.cost_summary(**kw, filters=f, by=by, gpu_hour_usd=2.0)
            assert "error" not in cost and cost["rows"], cost
            assert data.cost_summary(**kc, filters=f, by=by, gpu_hour_usd=2.0) == cost
        _frames(data.cost_over_time(**kc, filters=f, by="tenant", bucket_s=60, gpu_hour_usd=2.0),
                data.cost_over_time(**kw, filters=f, by="tenant", bucket_s=60, gpu_hour_usd=2.0))
        for sp in data.spikes(**kw, filters=f):
            spikes_seen += 1
            a, b = data.spike_times_ns(sp)
            assert data.explain(**kc, filters=f, start_ns=a, end_ns=b) == {**sp, "detected": True}
            for lo, hi in [(a - 2 * MINUTE, a + MINUTE), (b, b + 2 * MINUTE)]:  # brushed windows
                _same(data.explain(**kc, filters=f, start_ns=lo, end_ns=hi),
                      data.explain(**kw, filters=f, start_ns=lo, end_ns=hi))
        ex = data.exemplars(**kw, filters=f, limit=20)
        got = data.exemplars(**kc, filters=f, limit=20)
        _frames(got, ex, drop=("start",))
        ids = tuple(ex["trace_id"].head(3))
        _frames(data.exemplars(**kc, filters=f, limit=3, trace_ids=ids),
                data.exemplars(**kw, filters=f, limit=3, trace_ids=ids), drop=("start",))
    assert spikes_seen >= 1, "the sample has a spike"
    slow = data.exemplars(**kw, filters=data.Filters(), limit=2)
    for tid, start in zip(slow["trace_id"], slow["start_ns"], strict=True):
        want = data.find_trace(**kw, trace_id=tid[:10])
        got = data.find_trace(**kc, trace_id=tid[:10])
        _frames(got, want, drop=("start", "critical_path"))
        _frames(data.trace_spans(**kc, trace_id=tid, start_ns=int(start)),
                data.trace_spans(**kw, trace_id=tid, start_ns=int(start)))


def test_the_console_is_read_only_on_clickhouse(benches: tuple[data.Workbench, CHD.ClickHouseBench],
                                                tmp_path: Path) -> None:
    wb, ch = benches
    got, cut = CHD.run_sql(ch, "SELECT replica, count() AS n FROM requests GROUP BY replica ORDER BY replica", 10, 100)
    want, _ = data.run_sql(str(wb.store), "SELECT replica, count(*) AS n FROM requests GROUP BY 1 ORDER BY 1")
    assert not cut and got.to_dict("list") == want.to_dict("list")
    for name, sql in CHD.SQL_EXAMPLES.items():
        shown, _ = CHD.run_sql(ch, sql, 10, 100)
        assert len(shown) > 0, name
    _, cut = CHD.run_sql(ch, "SELECT * FROM spans", 10, 5)
    assert cut
    # a trailing line comment (-- or #) once swallowed the SETTINGS clause that carries readonly = 1 on chdb, and
    # INTO OUTFILE writes a file on chdb even read-only: each is refused, and no file is written
    written = tmp_path / "written.csv"
    for bad in ("DROP TABLE otel_traces", "WITH 1 AS x INSERT INTO otel_traces SELECT * FROM otel_traces",
                "SELECT * FROM file('x.csv')", "SELECT 1 SETTINGS readonly = 0", "",
                "SELECT * FROM file('/etc/hostname', 'LineAsString') --", "SELECT * FROM url('http://127.0.0.1:9/x', "
                "'LineAsString') # read-only?", "SELECT 1 SETTINGS readonly = 0 --",
                f"SELECT 1 INTO OUTFILE '{written}'", f"SELECT 1 into /* a comment */ OutFile '{written}' --"):
        with pytest.raises(C.QueryError):
            CHD.run_sql(ch, bad, 10, 5)
    assert not written.exists()
    assert CHD.run_sql(ch, "SELECT count() AS n FROM otel_traces", 10, 5)[0]["n"][0] > 0  # nothing was dropped


def test_every_page_runs_on_clickhouse(benches: tuple[data.Workbench, CHD.ClickHouseBench], exported: tuple[Path, str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    wb, _ = benches
    monkeypatch.setenv(ENV_ENGINE, "clickhouse")
    monkeypatch.setenv(ENV_DSN, exported[1])
    at = AppTest.from_file(str(APP), default_timeout=300)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    # attribute filters on a table too: the node filter narrows the requests as on the store
    at.toggle(key="f_attr_on").set_value(True).run()
    choices = data.attribute_choices(wb, str(wb.store), wb.version)
    assert at.multiselect(key="f_attrs").options == list(choices)
    node = choices["k8s.node.name"]["values"][0]
    at.multiselect(key="f_attrs").select("k8s.node.name").run()
    at.multiselect(key="f_attr_values:k8s.node.name").select(node).run()
    assert not at.exception, [e.message for e in at.exception]
    f = data.Filters(attributes=(data.attribute_filter(choices, "k8s.node.name", (node,)),))
    want = data.summary(wb, str(wb.store), wb.version, f)["requests_weighted"]
    assert next(m.value for m in at.metric if m.label == "requests") == format(want, ",.0f")
    at.multiselect(key="f_attrs").set_value([]).run()
    sp = data.report_of(wb, str(wb.store), wb.version, data.Filters())["spikes"][0]
    a, b = (pd.Timestamp(t, unit="ns", tz="UTC") for t in data.spike_times_ns(sp))
    # as it reads: a clock's colons are escaped in the banner's Markdown (dashboard.formats.times)
    assert any(f"Spike {a:%H:%M:%S}–{b:%H:%M:%S} UTC" in w.value.replace("\\:", ":") for w in at.warning)
    at.switch_page("app_pages/spike.py").run()
    assert not at.exception, [e.message for e in at.exception]
    lead = sp["dimensions"][0]
    assert any(f"{lead['dimension']} = {lead['value']}" in s.value for s in at.success)
    at.switch_page("app_pages/traces.py").run()
    assert not at.exception, [e.message for e in at.exception]
    assert any(s.value.startswith("Trace ") for s in at.subheader)
    at.switch_page("app_pages/shape.py").run()
    assert not at.exception, [e.message for e in at.exception]
    assert any(m.value.startswith("Slowest cell with a p99 to trust") for m in at.markdown)
    reps = data.replicas(wb, str(wb.store), wb.version, data.Filters())
    outliers = reps[reps["outlier"]]["replica"].tolist()
    at.switch_page("app_pages/replicas.py").run()
    assert not at.exception, [e.message for e in at.exception]
    if outliers:  # the store's outliers, named by the ClickHouse page: its own, or explained by the same value
        explained = {e["replica"]: e for e in data.outlier_explanations(wb, str(wb.store), wb.version, data.Filters(),
                                                                        "e2e")}
        own = [r for r in outliers if r not in explained]
        assert not own or any(all(f"**{r}**" in e.value for r in own) for e in at.error), [e.value for e in at.error]
        for r, e in explained.items():
            assert any(w.value.startswith(f"**{r}** is flagged an outlier") and f"**{e['dimension']} = {e['value']}**"
                       in w.value for w in at.warning), [w.value for w in at.warning]
    else:
        assert any(s.value.startswith(f"No outlier among the {int(reps['judged'].sum())} replicas judged")
                   for s in at.success)
    at.switch_page("app_pages/whatif.py").run()
    assert not at.exception and not at.warning, ([e.message for e in at.exception], [w.value for w in at.warning])
    assert len(at.metric) == 3
    at.switch_page("app_pages/capacity.py").run()
    assert not at.exception, [e.message for e in at.exception]
    assert not [w.value for w in at.warning if "could not" in w.value]
    at.switch_page("app_pages/cost.py").run()
    assert not at.exception and not at.warning, ([e.message for e in at.exception], [w.value for w in at.warning])
    assert len(at.metric) == 4 and len(shown_tables(at)) == 2
    at.switch_page("app_pages/alerts.py").run()
    assert not at.exception, [e.message for e in at.exception]
    assert [i.value for i in at.info] == [
        f"The Alerts page does not run on this engine yet: {CHD.NOT_YET_CAN['alerts']}; open `tailscope dashboard "
        "--store DIR` on a store for it."]
    at.switch_page("app_pages/sql.py").run()
    at.button(key="sql_run").click().run()
    assert not at.exception and not at.error and len(at.dataframe) == 1
    at.text_area(key="sql_text").set_value("DROP TABLE otel_traces").run()
    at.button(key="sql_run").click().run()
    assert [e.value for e in at.error] == ["Query failed: only SELECT / WITH queries are allowed here, not DROP"]
