"""The GPU-time sweep stored with each materialized hour: summed at read time, it equals the sweep run over the
spans, for ranges that cut hours or not, with and without a grid (and the Cost page's table and series from one
sweep equal the two apart); and a cost file follows its hour."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from analysis import connect
from analysis.cost import (
    KeptRuns,
    Prices,
    cost_page,
    cost_series,
    cost_table,
    drop_sweep,
    gpu_shares,
    keep_runs,
    series_bucket_s,
)
from analysis.engine import gpu_sweep as GS
from analysis.engine.materialize import materialize, snapshot
from tests.factory import T0, add_request, write
from tracing.rows import SpanBatch

S = 1_000_000_000
H = 3600 * S


def _store(rng: random.Random, path: Path) -> None:
    """Requests on three replicas over three hours, many near an hour's edge, seconds to minutes long, some with
    prefill / decode parts and some with a model load: segments cross minute and hour edges."""
    batch = SpanBatch()
    for i in range(rng.randint(30, 60)):
        edge = rng.choice([H, 2 * H, rng.randint(0, 3 * H)])
        start = max(0, edge + rng.randint(-150 * S, 60 * S))
        end = start + rng.randint(2 * S, 200 * S)
        stages: list[tuple[Any, ...]] = []
        a = rng.randint(start, start + (end - start) // 3)
        if rng.random() < 0.2:
            stages.append(("model_load", start, a))
        g0 = rng.randint(a, end - S)
        g1 = rng.randint(g0 + 1, end)
        stages.append(("generation", g0, g1))
        if rng.random() < 0.4:
            p = rng.randint(g0, g1 - 1)
            stages += [("prefill", g0, p + 1, "generation"), ("decode", p + 1 + rng.randint(0, S), g1, "generation")]
        add_request(batch, i, start, end, [s for s in stages if s[1] < s[2]], replica=rng.choice("ABC"),
                    attrs={"tailscope.tenant": rng.choice(["x", "y"]), "gen_ai.usage.output_tokens": "5"})
    write(path, batch)


def _rows(con: Any, **kw: Any) -> tuple[dict[Any, int], dict[Any, tuple[int, ...]]]:
    shares, reps = gpu_shares(con, **kw)
    a = {(r, t, s, b): n for r, t, s, b, n in con.execute(  # a share read from stored hours may be several rows
        f"SELECT replica, trace_id, request_span_id, bucket_ns, sum(allocated_ns) FROM {shares} GROUP BY ALL"
    ).fetchall() if n}
    b = {(r, bk): v for r, bk, *v in con.execute(
        f"SELECT replica, bucket_ns, observed_ns, allocated_ns, cold_start_ns, idle_ns FROM {reps}").fetchall()
        if v[0]}
    drop_sweep(con)
    return a, b


def test_stored_hours_summed_equal_the_sweep_over_the_spans(tmp_path: Path) -> None:
    rng = random.Random(33)
    for case in range(3):
        path = tmp_path / f"s{case}"
        _store(rng, path)
        materialize(path)
        con = connect(path)
        stored = con.execute(f"SELECT count(*) FROM {GS.COST_FILES_VIEW}").fetchone()
        assert stored is not None and stored[0] >= 3
        cut = T0 + rng.randint(1, 59) * 60 * S + rng.randint(0, S)  # inside the first hour: it is swept live
        for kw in ({}, {"since": cut, "until": T0 + 2 * H}, {"since": T0 + H, "until": T0 + 3 * H + 7 * S},
                   {"since": cut, "grid_ns": 120 * S}, {"grid_ns": 7 * S}):
            want = _rows(con, stored=False, **kw)
            got = _rows(con, **kw)
            assert want[0] and got == want, (case, kw)
            assert sum(v[1] for v in got[1].values()) == sum(got[0].values())
            for obs, alloc, cold, idle in got[1].values():
                assert alloc + cold + idle == obs and min(alloc, cold, idle) >= 0
        # the cost table and series read the stored hours; with them hidden from the connection, every span is swept
        table, series = cost_table(con, by="tenant"), cost_series(con, by="tenant", bucket_s=300).to_dicts()
        # the Cost page's one sweep for both gives the same table and series, ranges cutting hours or not
        for by, since, until in (("tenant", None, None), ("replica", cut, T0 + 2 * H),
                                 ("model", T0 + H, T0 + 3 * H + 7 * S)):
            prices = Prices(default=2.0, replica={"A": 3.0})
            keys = {r["key"] for r in table["rows"]} if by == "tenant" else {"A"}
            page, frame = cost_page(con, by=by, bucket_s=300, prices=prices, since=since, until=until, keys=keys)
            assert page == cost_table(con, by=by, prices=prices, since=since, until=until, keys=keys), (case, by)
            assert frame.equals(cost_series(con, by=by, bucket_s=300, prices=prices, since=since, until=until)), \
                (case, by)
        con.execute(f"CREATE OR REPLACE VIEW {GS.COST_FILES_VIEW} AS "
                    "SELECT NULL::BIGINT AS hour_ns, NULL::VARCHAR AS path WHERE false")
        assert table == cost_table(con, by="tenant") and table["totals"]["allocated_ns"] > 0
        assert series == cost_series(con, by="tenant", bucket_s=300).to_dicts()
        con.close()


def test_live_hours_swept_beside_stored_ones_equal_the_sweep_over_the_spans(tmp_path: Path) -> None:
    """The dashboard's case: the last hours not materialized, so the run sweeping them starts at an hour edge that
    many requests cross (it reads only the running traces of the hour before)."""
    rng = random.Random(8)
    for case in range(2):
        path = tmp_path / f"s{case}"
        _store(rng, path)
        materialize(path, settled_before_ns=T0 + 3 * H)  # the hours from T0 + 2 h stay live
        con = connect(path)
        assert [h for (h,) in con.execute(f"SELECT hour_ns FROM {GS.COST_FILES_VIEW} ORDER BY 1").fetchall()] == [
            T0, T0 + H]
        crossing = con.execute(f"SELECT count(*) FROM spans WHERE IsRequest AND TimestampNs < {T0 + 2 * H} "
                               f"AND EndNs > {T0 + 2 * H}").fetchall()[0][0]
        assert crossing >= 5, crossing
        for kw in ({}, {"grid_ns": 60 * S}, {"since": T0 + H, "grid_ns": 600 * S}):
            want = _rows(con, stored=False, **kw)
            assert want[0] and _rows(con, **kw) == want, (case, kw)
        con.close()


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_live_runs_kept_equal_the_live_runs_swept(tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The dashboard keeps the sweeps of the runs beside the stored hours per refresh (`kept`): read back they give
    the rows sweeping gives, and once kept (by a first call or by keep_runs) nothing is swept again."""
    rng = random.Random(seed)
    _store(rng, tmp_path)
    materialize(tmp_path, settled_before_ns=T0 + 3 * H)  # the hours from T0 + 2 h stay live
    con = connect(tmp_path)
    cut = T0 + rng.randint(1, 59) * 60 * S  # the stored hour after it lies in the range: the rest is swept in runs
    cases: list[dict[str, Any]] = [{}, {"grid_ns": 60 * S}, {"since": T0 + H, "grid_ns": 600 * S},
                                   {"since": cut, "until": T0 + 3 * H + rng.randint(1, 59) * 60 * S,
                                    "grid_ns": 120 * S}]
    kept: KeptRuns = {}
    want = {i: _rows(con, stored=False, **kw) for i, kw in enumerate(cases)}
    for i, kw in enumerate(cases):
        assert want[i][0] and _rows(con, kept=kept, **kw) == want[i], (seed, kw)
    # the whole range's runs: before the first stored hour, and the live hours on
    assert {(-(2**62), T0, None), (T0 + 2 * H, 2**62, None)} <= kept.keys()
    page = cost_page(con, by="tenant", bucket_s=120, prices=Prices(default=2.0), since=cut, until=cases[3]["until"])
    # keep_runs sweeps what a later call reads: the same runs as those calls put, and no sweep after it
    ahead: KeptRuns = {}
    for kw in cases:
        keep_runs(con, ahead, kw.get("since"), kw.get("until"), kw.get("grid_ns"))
    assert ahead.keys() == kept.keys() and all(ahead[k][0].equals(kept[k][0]) and ahead[k][1].equals(kept[k][1])
                                               for k in kept)
    assert keep_runs(con, ahead, cut, cases[3]["until"], 120 * S) == 0

    def no_sweep(*a: Any, **k: Any) -> None:
        raise AssertionError("swept again")

    monkeypatch.setattr(GS, "run_sweep", no_sweep)
    for i, kw in enumerate(cases):
        assert _rows(con, kept=ahead, **kw) == want[i], (seed, kw)
    got = cost_page(con, by="tenant", bucket_s=120, prices=Prices(default=2.0), since=cut, until=cases[3]["until"],
                    kept=ahead)
    assert got[0] == page[0] and got[1].equals(page[1])
    con.close()


def test_a_cost_file_is_written_with_its_hour_and_superseded_with_it(tmp_path: Path) -> None:
    rng = random.Random(5)
    _store(rng, tmp_path)
    written = materialize(tmp_path)
    assert written and all(GS.cost_path(f).is_file() for f in written)
    snap = snapshot(tmp_path)
    on_disk = set(tmp_path.glob("requests/*/*/cost-*"))
    assert not snap.stale and {GS.cost_path(f) for f in snap.fresh.values()} == on_disk
    # a reader whose listed cost file was removed since (superseded, its grace over) sweeps the spans instead
    con = connect(tmp_path)
    want = _rows(con, stored=False)
    GS.cost_path(written[0]).unlink()
    assert _rows(con) == want
    con.close()


def test_the_series_cells_are_whole_minutes() -> None:
    """The Cost page's cells: the report's window rounded up to whole minutes (so they sum stored minutes)."""
    assert [series_bucket_s(w) for w in (1, 10, 59.5, 60, 61, 120, 300, 3600)] == [60, 60, 60, 60, 120, 120, 300,
                                                                                  3600]
