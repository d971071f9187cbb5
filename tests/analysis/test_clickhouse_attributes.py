"""Every attribute a candidate dimension on ClickHouse (chdb): the numbers read and bucketed in SQL as in memory on
random text, each request's value by the rules against the plain reference of test_attributes on random stores,
and the report (with its `attributes` object) equal to the store's on the attribute test store, patterns included
(the CLI's: tests/tailscope/test_clickhouse_cli.py). The catalogue samples carrying attributes are compared in
test_clickhouse.py."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from analysis import build_report, connect
from analysis.clickhouse import attributes as CA
from analysis.clickhouse import client as C
from analysis.clickhouse.export import export_store
from analysis.clickhouse.report import build_report as ch_report
from analysis.clickhouse.requests import requests_facts
from analysis.stats import attributes as A
from tests.analysis.recording import Recording
from tests.analysis.test_attributes import (
    SHADE_SKIPPED,
    SLOW_NODE,
    check_pair_named,
    node_store,
    pair_store,
    random_store,
)

pytestmark = pytest.mark.slow  # ClickHouse (chdb) end to end


class _Patterns(TypedDict, total=False):
    """The report's dimension patterns a test passes to both engines."""

    dimensions: str
    exclude_dimensions: str


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Any:
    c = C.open_client(f"chdb:{tmp_path_factory.mktemp('chdb')}")
    yield c
    c.close()


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory, client: Any) -> Path:
    store = node_store(tmp_path_factory.mktemp("nodes"))
    export_store(store, client, "t_nodes")
    return store


def _texts(rng: random.Random, n: int) -> list[str]:
    """Text an attribute may hold: numbers of every size and spelling (powers of two and their neighbours), and
    text that only looks like one."""
    fixed = ["0", "-0", "+0", "0.0", "1", "2", "3", "4", "-1", "-4", ".5", "5.", "1e3", "1E+3", "1e", "e3", " 1",
             "1 ", "inf", "-inf", "nan", "NaN", "Infinity", "1e400", "-1e400", "4.9e-324", "1e-330", "0x10", "1_000",
             "", "abc", "--1", "+.5e1", "00012", "9007199254740993", "9223372036854775807", "1,5", "true"]
    out = list(fixed)
    for _ in range(n):
        kind = rng.randrange(5)
        if kind == 0:
            k = rng.randrange(0, 70)
            out.append(str(2 ** k + rng.choice([-1, 0, 1])))
        elif kind == 1:
            out.append(repr(rng.uniform(-1, 1) * 10 ** rng.randrange(-12, 20)))
        elif kind == 2:
            out.append(str(rng.randrange(-10 ** 6, 10 ** 6)))
        elif kind == 3:
            out.append(f"{rng.uniform(0, 1000):.{rng.randrange(0, 6)}f}")
        else:
            out.append("".join(rng.choice("0123456789.e-+x ") for _ in range(rng.randrange(1, 6))))
    return out


def test_numbers_are_read_and_bucketed_on_the_server_as_in_memory(client: Any) -> None:
    texts = _texts(random.Random(11), 4000)
    client.command("DROP TABLE IF EXISTS t_texts")
    client.command("CREATE TABLE t_texts (i Int64, v String) ENGINE = Memory")
    client.insert_arrow("t_texts", pa.table({"i": np.arange(len(texts)), "v": texts}))
    got = client.query(f"SELECT i, {CA.parses_sql('v')} AS ok, if(ok, {CA.number_key_sql('v')}, -1) AS key "
                       "FROM t_texts ORDER BY i").to_pylist()
    # the reference: what the DuckDB report reads (Arrow's cast, finite only) and how it buckets (number_keys)
    want_ok, want_x = [], []
    for t in texts:
        try:
            x = pc.cast(pa.array([t]), pa.float64())[0].as_py()
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            x = None
        want_ok.append(x is not None and np.isfinite(x))
        want_x.append(x if want_ok[-1] else np.nan)
    keys, _ = A.number_keys(np.asarray(want_x, dtype=np.float64))
    assert [bool(r["ok"]) for r in got] == want_ok
    assert [int(r["key"]) for r in got] == keys.tolist()
    assert sum(want_ok) > 3000 and len(set(keys.tolist())) > 100


@pytest.mark.parametrize("seed", [1, 2])
def test_each_request_gets_the_value_the_rules_give_on_the_server(tmp_path: Path, client: Any, seed: int) -> None:
    store, expected = random_store(tmp_path / "s", seed)
    table = f"t_random_{seed}"
    client.command(f"DROP TABLE IF EXISTS {table}")
    export_store(store, client, table)
    if seed == 2:  # seven request spans delivered twice: each request still read once, as the DuckDB report reads it
        client.command(f"INSERT INTO {table} SELECT * FROM {table} WHERE SpanAttributes['tailscope.request'] = 'true' "
                       "ORDER BY TraceId LIMIT 7")
    facts = requests_facts(client, table, name="_facts_random")
    out = CA.read_attributes(client, table, facts, "TRUE", None, None, A.AttributeRules())
    names = [c.name for c in out.attrs.coded]
    assert set(names) == {"color", "n", "phase", "host", "rack", "service.name"}, out.attrs.skipped
    assert SHADE_SKIPPED in out.attrs.skipped  # the same-partition test of the coded keys, asked all at once
    cols = ", ".join(f"{out.code_sql[n]} AS c{i}" for i, n in enumerate(names))
    rows = client.query(f"SELECT trace_id, {cols} FROM {CA.ATTR_TEMP}").to_pylist()
    assert len(rows) == len(expected)
    for r in rows:
        got = {n: c.labels[r[f"c{i}"]] for i, (n, c) in enumerate(zip(names, out.attrs.coded, strict=True))
               if r[f"c{i}"] >= 0}
        assert got == expected[r["trace_id"]], r["trace_id"]
    # and the whole pass says what the store's says
    assert ch_report(client, table)["attributes"] == build_report(connect(store))["attributes"]


@pytest.mark.parametrize("patterns", [{}, {"exclude_dimensions": "k8s.*"}, {"dimensions": "replica,cloud.*"}],
                         ids=["every", "exclude", "include"])
def test_the_report_on_the_node_store_equals_the_stores(nodes: Path, client: Any, patterns: _Patterns) -> None:
    got = ch_report(client, "t_nodes", **patterns)
    assert got == build_report(connect(nodes), **patterns)
    top = got["spikes"][0]["dimensions"][0]
    if not patterns:  # the node named, its replicas under it, as on the store (test_attributes)
        assert (top["dimension"], top["value"], top["source"]) == ("k8s.node.name", SLOW_NODE, "resource")
        assert top["finer"] and all(f["dimension"] == "replica" for f in top["finer"])
    else:
        assert top["dimension"] != "k8s.node.name"


def long_traces_store(path: Path) -> tuple[Path, dict[str, str | None]]:
    """40 requests in one hour, each with a prefill span carrying `phase`; the traces of requests 0..9 also hold a
    stage span 150 minutes later (two hours on: outside the rule's hours) with another `phase`, those of 10..14 one
    70 minutes later (the next hour: inside). Returns each trace's `phase` by the rule (the stage spans of its trace
    starting in the request's hour or the hour on either side): its own for 0..9, none for 10..14 (they disagree);
    reading every stage span of the trace would give none for 0..9 too."""
    from tests.analysis.test_attributes import MS, _append
    from tests.factory import hex_id, write
    from tracing import schema as S
    from tracing.rows import SpanBatch

    batch = SpanBatch()
    want: dict[str, str | None] = {}
    res = {"service.name": "llm", "service.instance.id": "r0"}
    for i in range(40):
        start, end = i * 80_000 * MS, i * 80_000 * MS + (300 + 10 * i) * MS
        trace, root = hex_id("long", i, size=32), hex_id("long-root", i)
        own = "ab"[i % 2]
        _append(batch, trace, root, "", "request", start, end, res, {S.ATTR_REQUEST: "true"}, kind="Server")
        _append(batch, trace, hex_id("long-p", i), root, "prefill", start, end, res,
                {S.ATTR_STAGE: "prefill", "phase": own})
        late = 150 * 60_000 * MS if i < 10 else 70 * 60_000 * MS if i < 15 else None
        if late is not None:
            _append(batch, trace, hex_id("long-d", i), root, "decode", start + late, start + late + 100 * MS, res,
                    {S.ATTR_STAGE: "decode", "phase": "z"})
        want[trace] = None if 10 <= i < 15 else own
    write(path, batch)
    return path, want


def test_stage_values_come_from_the_spans_of_the_requests_hours(tmp_path: Path, client: Any) -> None:
    store, want = long_traces_store(tmp_path / "long")
    client.command("DROP TABLE IF EXISTS t_long")
    export_store(store, client, "t_long")
    facts = requests_facts(client, "t_long", name="_facts_long")
    out = CA.read_attributes(client, "t_long", facts, "TRUE", None, None, A.AttributeRules())
    phase = next(c for c in out.attrs.coded if c.name == "phase")
    assert phase.source == "stage"
    rows = client.query(f"SELECT trace_id, {out.code_sql['phase']} AS c FROM {CA.ATTR_TEMP}").to_pylist()
    got = {r["trace_id"]: phase.labels[r["c"]] if r["c"] >= 0 else None for r in rows}
    assert got == want
    # the store's report reads the same values (the whole `attributes` object alike)
    assert ch_report(client, "t_long")["attributes"] == build_report(connect(store))["attributes"]


def test_a_pair_of_an_attribute_and_a_builtin_is_named_on_the_server_as_on_the_store(tmp_path: Path, client: Any
                                                                                      ) -> None:
    """Tenant globex on node-2: the pair counted on the server (its family and cells), the whole report the
    store's; only figures of the attributes come back, never a request's codes. With 600 and with 1,200 requests a
    window (same windows, replicas, tenants and cause) each query of the attribute pass returns exactly as many
    rows: what comes back does not grow with the requests."""
    each = []
    for per_window in (600, 1200):
        store = pair_store(tmp_path / f"pairs-{per_window}", per_window)
        table = f"t_pairs_{per_window}"
        client.command(f"DROP TABLE IF EXISTS {table}")
        export_store(store, client, table)
        counted = Recording(client)
        got = ch_report(counted, table, window_s=60)
        assert got == build_report(connect(store), window_s=60)
        check_pair_named(got)
        assert got["spikes"][0]["requests"] == 2 * per_window
        each.append(counted.attribute_each)
    assert each[0] == each[1], each
    # the largest answer: a row per replica and resource key (service.name, service.instance.id, k8s.node.name)
    assert max(each[0]) == 24 * 3, each
