"""Fair-share GPU time: hand-made splits, idle and cold start, and a per-instant reference on random stores."""

from __future__ import annotations

import itertools
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from analysis import connect
from analysis.cost import (
    Prices,
    clickhouse_gpu_shares,
    cost_series,
    cost_table,
    drop_sweep,
    gpu_shares,
    load_prices,
    prices_for,
)
from analysis.engine import gpu_sweep as GS
from analysis.engine.gpu_sweep import sweep_params
from tests import samples_cache
from tests.factory import T0, add_request, hex_id, write
from tests.sql import one
from tracing.errors import QueryError
from tracing.rows import SpanBatch

S = 1_000_000_000


def _tenant(t: str, out: int = 0, model: str = "m") -> dict[str, str]:
    return {"tailscope.tenant": t, "gen_ai.usage.output_tokens": str(out), "gen_ai.request.model": model}


def _shares(con: Any, **kw: Any) -> tuple[dict[tuple[str, str, int], int], dict[tuple[str, int], tuple[int, ...]]]:
    shares, reps = gpu_shares(con, **kw)
    a = {(r, t, b): n for r, t, b, n in con.execute(
        f"SELECT replica, trace_id, bucket_ns, allocated_ns FROM {shares}").fetchall()}
    b: dict[tuple[str, int], tuple[int, ...]] = {(r, bk): (o, al, c, i) for r, bk, o, al, c, i in con.execute(
        f"SELECT replica, bucket_ns, observed_ns, allocated_ns, cold_start_ns, idle_ns FROM {reps}").fetchall()}
    drop_sweep(con)
    return a, b


def test_overlapping_requests_on_two_replicas_split_exactly(tmp_path: Path) -> None:
    batch = SpanBatch()
    # replica A: r1 generates [0, 10 s), r2 [4 s, 10 s): 4 s alone, then 6 s shared -> r1 7 s, r2 3 s
    add_request(batch, "r1", 0, 10 * S, [("generation", 0, 10 * S)], replica="A", attrs=_tenant("x", 100))
    add_request(batch, "r2", 4 * S, 12 * S, [("queue_wait", 4 * S, 4 * S), ("generation", 4 * S, 10 * S),
                                            ("streaming", 10 * S, 12 * S)], replica="A", attrs=_tenant("y", 50))
    # replica B: r3 split into prefill + decode with a 1 s gap the generation span covers (not GPU time)
    add_request(batch, "r3", 0, 9 * S, [("generation", 1 * S, 9 * S), ("prefill", 1 * S, 2 * S, "generation"),
                                        ("decode", 3 * S, 9 * S, "generation")], replica="B", attrs=_tenant("x", 10))
    # r4 on B: 3 requests at once over 1 ns-odd length: 7 ns among r3 and r4 -> floor 3, remainder 1 to the last ender
    add_request(batch, "r4", 5 * S, 5 * S + 7, [("generation", 5 * S, 5 * S + 7)], replica="B",
                attrs=_tenant("y", 1))
    write(tmp_path, batch)
    con = connect(tmp_path)
    alloc, reps = _shares(con)
    t = {k: hex_id("trace", k, size=32) for k in ("r1", "r2", "r3", "r4")}
    assert alloc[("A", t["r1"], 0)] == 7 * S
    assert alloc[("A", t["r2"], 0)] == 3 * S
    # r3 ends last (9 s > 5 s + 7 ns): it takes the remainder of the shared 7 ns
    assert alloc[("B", t["r4"], 0)] == 3
    assert alloc[("B", t["r3"], 0)] == 1 * S + 6 * S - 3
    # A observed 0..12 s: 10 s allocated, 2 s idle (r2 streaming); B 0..9 s: 1 s before prefill + 1 s gap idle
    assert reps[("A", 0)] == (12 * S, 10 * S, 0, 2 * S)
    assert reps[("B", 0)] == (9 * S, 7 * S, 0, 2 * S)
    out = cost_table(con, by="tenant", prices=Prices(default=3.6))
    rows = {r["key"]: r for r in out["rows"]}
    assert rows["x"]["gpu_ns"] == 7 * S + 7 * S - 3
    assert rows["y"]["gpu_ns"] == 3 * S + 3
    assert rows["x"]["cost_usd"] == pytest.approx((14 * S - 3) * 3.6 / 3600e9)
    assert rows["x"]["output_tokens"] == 110 and rows["x"]["requests"] == 2
    assert rows["x"]["usd_per_1k_output_tokens"] == pytest.approx(rows["x"]["cost_usd"] / 110 * 1000)
    assert out["totals"]["allocated_ns"] == 17 * S
    assert out["totals"]["idle_ns"] == 4 * S
    by_rep = {r["key"]: r["gpu_ns"] for r in cost_table(con, by="replica")["rows"]}
    assert by_rep == {"A": 10 * S, "B": 7 * S}
    # the totals of some keys (the dashboard's headline under a filter): their rows' GPU time and cost, a key with
    # no row adding nothing; no cost when a row of them has none (B unpriced) or no price is set
    assert "selected" not in out
    assert cost_table(con, by="tenant", prices=Prices(default=3.6), keys=["z", "x"])["selected"] == {
        "keys": ["x", "z"], "allocated_ns": 14 * S - 3, "allocated_usd": rows["x"]["cost_usd"]}
    assert cost_table(con, by="tenant", keys=("y",))["selected"] == {"keys": ["y"], "allocated_ns": 3 * S + 3,
                                                                     "allocated_usd": None}
    one_priced = Prices(replica={"A": 1.8})
    assert cost_table(con, by="replica", prices=one_priced, keys=["A"])["selected"] == {
        "keys": ["A"], "allocated_ns": 10 * S, "allocated_usd": pytest.approx(10 * 1.8 / 3600)}
    assert cost_table(con, by="replica", prices=one_priced, keys=["A", "B"])["selected"]["allocated_usd"] is None
    assert cost_table(con, by="replica", prices=one_priced, keys=["C"])["selected"] == {
        "keys": ["C"], "allocated_ns": 0, "allocated_usd": 0.0}
    # a clipped window: [5 s, 8 s) on A is r1 and r2 sharing; on B r3 decoding alone from 5 s + 7 ns
    alloc, reps = _shares(con, since=T0 + 5 * S, until=T0 + 8 * S)
    assert alloc[("A", t["r1"], 0)] == alloc[("A", t["r2"], 0)] == 3 * S // 2
    assert reps[("A", 0)] == (3 * S, 3 * S, 0, 0)


def test_cold_start_and_idle_are_kept_apart(tmp_path: Path) -> None:
    batch = SpanBatch()
    # r1 loads the model 2 s, then generates 3 s; r2 arrives during the load and waits, then runs alongside
    add_request(batch, "r1", 0, 6 * S, [("model_load", 0, 2 * S), ("generation", 2 * S, 5 * S)], replica="A")
    add_request(batch, "r2", 1 * S, 6 * S, [("queue_wait", 1 * S, 2 * S), ("generation", 4 * S, 6 * S)],
                replica="A")
    write(tmp_path, batch)
    con = connect(tmp_path)
    alloc, reps = _shares(con)
    obs, al, cold, idle = reps[("A", 0)]
    assert (obs, al, cold, idle) == (6 * S, 4 * S, 2 * S, 0)
    assert alloc[("A", hex_id("trace", "r1", size=32), 0)] == 2 * S + S // 2
    assert alloc[("A", hex_id("trace", "r2", size=32), 0)] == S // 2 + S


def _random_store(rng: random.Random, path: Path) -> list[dict[str, Any]]:
    """A small store of random requests on two replicas; returns each request's spans (offsets from T0)."""
    batch = SpanBatch()
    reqs = []
    for i in range(rng.randint(1, 7)):
        start = rng.randint(0, 30)
        end = start + rng.randint(1, 25)
        stages: list[tuple[Any, ...]] = []
        if rng.random() < 0.3:
            stages.append(("queue_wait", start, rng.randint(start, end)))
        if rng.random() < 0.3:
            a = rng.randint(start, end)
            stages.append(("model_load", a, rng.randint(a, end)))
        if rng.random() < 0.8:
            g0 = rng.randint(start, end - 1)
            g1 = rng.randint(g0 + 1, end)
            stages.append(("generation", g0, g1))
            if rng.random() < 0.5:
                for part in ("prefill", "decode"):
                    if rng.random() < 0.8:
                        a = rng.randint(g0, g1 - 1)
                        stages.append((part, a, rng.randint(a + 1, g1), "generation"))
        replica = rng.choice(["A", "B"])
        add_request(batch, i, start, end, stages, replica=replica)
        reqs.append({"trace": hex_id("trace", i, size=32), "span": hex_id("span", i, "request"), "replica": replica,
                     "start": start, "end": end, "stages": stages})
    write(path, batch)
    return reqs


def _reference(reqs: list[dict[str, Any]], lo: int, hi: int, grid: int | None,
               cell: int | None = None) -> tuple[dict[Any, int], dict[Any, tuple[int, ...]]]:
    """Per-instant reference: active sets instant by instant, then the segment rule; with `cell`, each cell
    (multiples of `cell` ns since the epoch, times here being offsets from T0) is swept on its own: its edges cut
    segments and the remainder goes to the active request whose run ends last within the cell."""
    alloc: dict[Any, int] = defaultdict(int)
    reps: dict[Any, tuple[int, ...]] = {}
    for rep in sorted({r["replica"] for r in reqs}):
        mine = [r for r in reqs if r["replica"] == rep]
        spans = [(r["start"], r["end"]) for r in mine] + [(s[1], s[2]) for r in mine for s in r["stages"]]
        gpu: dict[str, list[tuple[int, int]]] = {}
        loads = [(s[1], s[2]) for r in mine for s in r["stages"] if s[0] == "model_load"]
        for r in mine:
            parts = [(s[1], s[2]) for s in r["stages"] if s[0] in ("prefill", "decode")]
            gens = [(s[1], s[2]) for s in r["stages"] if s[0] == "generation"]
            gpu[r["trace"] + ":" + r["span"]] = parts or gens
        if not any(gpu.values()) and not loads:
            continue
        first, last = max(min(s for s, _ in spans), lo), min(max(e for _, e in spans), hi)
        if last <= first:
            continue
        def on(k: str, t: int) -> bool:
            return any(s <= t < e for s, e in gpu[k])  # noqa: B023
        # boundaries: where some request's GPU coverage or a model_load starts or ends, plus the window ends
        bounds = {first, last}
        for t in range(first, last + 1):
            for k in gpu:
                if on(k, t) != on(k, t - 1) and (t < last or on(k, t - 1)):
                    bounds.add(t)
            for s, e in loads:
                if first < s < last:
                    bounds.add(s)
                if first < e < last:
                    bounds.add(e)
        if grid:
            bounds |= {g for g in range(first - first % grid + grid, last, grid)}
        if cell:
            bounds |= {t for t in range(first + 1, last) if (T0 + t) % cell == 0}
        bounds_l = sorted(b for b in bounds if first <= b <= last)
        totals: defaultdict[int, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
        for t0, t1 in itertools.pairwise(bounds_l):
            bucket = (t0 - t0 % grid) if grid else 0
            active = sorted(k for k in gpu if on(k, t0))
            for t in range(t0, t1):  # the active set is constant inside a segment
                assert sorted(k for k in gpu if on(k, t)) == active
            length = t1 - t0
            totals[bucket][0] += length
            if active:
                q, r = divmod(length, len(active))
                for k in active:
                    alloc[(rep, k.split(":")[0], bucket)] += q
                def run_end(k: str, t: int) -> int:
                    while on(k, t):
                        t += 1
                    return t
                cell_end = t0 + cell - (T0 + t0) % cell if cell else hi
                best = max(active, key=lambda k: (min(run_end(k, t0), hi, cell_end), k))
                if r:
                    alloc[(rep, best.split(":")[0], bucket)] += r
                totals[bucket][1] += length
            elif any(s <= t0 < e for s, e in loads):
                totals[bucket][2] += length
            else:
                totals[bucket][3] += length
        for bucket, v in totals.items():
            reps[(rep, bucket)] = tuple(v)
    return {k: v for k, v in alloc.items() if v}, reps


def test_sweep_matches_a_per_instant_reference_on_random_stores(tmp_path: Path) -> None:
    rng = random.Random(16)
    for case in range(48):
        path = tmp_path / f"s{case}"
        reqs = _random_store(rng, path)
        con = connect(path)
        lo, hi = (rng.randint(0, 20), rng.randint(25, 60)) if rng.random() < 0.4 else (-10**6, 10**6)
        grid = rng.choice([None, None, 4, 7])
        cell = rng.choice([None, 3, 5, 11])  # None: the minute, wider than these stores
        want_alloc, want_reps = _reference(reqs, lo, hi, grid, cell)
        got_alloc, got_reps = _shares(con, since=T0 + lo, until=T0 + hi, grid_ns=grid,
                                      **({"cell_ns": cell} if cell else {}))
        got_alloc = {(r, t, b - T0 if grid else 0): n for (r, t, b), n in got_alloc.items() if n}
        got_reps = {(r, b - T0 if grid else 0): v for (r, b), v in got_reps.items()}
        assert got_alloc == want_alloc, (case, reqs, lo, hi, grid, cell)
        # the identity: allocated (summed from the request shares) + cold start + idle = observed
        for (rep, cell), (obs, al, cold, idle) in got_reps.items():
            assert al == sum(n for (r, _, b), n in got_alloc.items() if (r, b) == (rep, cell))
            assert al + cold + idle == obs, (case, rep, cell)
        assert {k: v for k, v in got_reps.items() if v[0]} == {k: v for k, v in want_reps.items() if v[0]}, case
        # the arrays (what runs) give the SQL's rows exactly, zero shares and empty cells included, and its types
        rows = []
        for arrays in (True, False) if case % 3 == 0 else ():
            GS.run_sweep(con, sweep_params(T0 + lo, T0 + hi, grid), grid=grid is not None, weighted=False,
                         cell_ns=cell or GS.CELL_NS, arrays=arrays)
            rows.append([(con.execute(f"DESCRIBE {t}").fetchall(), con.execute(f"SELECT * FROM {t} ORDER BY ALL")
                          .fetchall()) for t in ("_cost_shares", "_cost_replicas")])
            drop_sweep(con)
        assert not rows or rows[0] == rows[1], case
        con.close()


def test_series_cells_add_up_to_the_observed_time(tmp_path: Path) -> None:
    batch = SpanBatch()
    add_request(batch, "r1", 0, 150 * S, [("generation", 10 * S, 130 * S)], replica="A", attrs=_tenant("x"))
    add_request(batch, "r2", 50 * S, 100 * S, [("model_load", 50 * S, 60 * S), ("generation", 60 * S, 100 * S)],
                replica="A", attrs=_tenant("y"))
    write(tmp_path, batch)
    con = connect(tmp_path)
    frame = cost_series(con, by="tenant", bucket_s=60, prices=Prices(default=1.0))
    cells = {(int(b - T0) // S, k): n for b, k, n in frame.select("bucket_ns", "key", "gpu_ns").iter_rows()}
    # 0-60 s: x alone 10-60 s (50 s; r2's load 50-60 s overlaps x's generation: no cold start), idle 0-10 s
    assert cells[(0, "x")] == 50 * S and cells[(0, "(idle)")] == 10 * S
    # 60-120 s: x and y share 60-100 s (20 s each), x alone 100-120 s
    assert cells[(60, "x")] == 40 * S and cells[(60, "y")] == 20 * S
    # 120-150 s: x 120-130 s, idle 130-150 s
    assert cells[(120, "x")] == 10 * S and cells[(120, "(idle)")] == 20 * S
    assert frame["gpu_ns"].sum() == 150 * S


def test_series_reads_each_cell_over_the_time_observed(tmp_path: Path) -> None:
    """A cell only partly observed (the data starts or ends inside it) is read over its observed part: `gpus`, GPU
    seconds a second, against a plain reference from the spans' times (seeds 1-5, random ranges); and a hand-made
    fleet of two replicas whose first spans start 17 s and 40 s into the first minute reads 2 x 43 s + 20 s of
    replica time over 43 s there, not over 60 s."""
    batch = SpanBatch()
    add_request(batch, "a", 17 * S, 150 * S, [("generation", 20 * S, 140 * S)], replica="A", attrs=_tenant("x"))
    add_request(batch, "b", 40 * S, 180 * S, [("generation", 40 * S, 170 * S)], replica="B", attrs=_tenant("y"))
    write(tmp_path / "hand", batch)
    frame = cost_series(connect(tmp_path / "hand"), by="tenant", bucket_s=60)
    total = {int(b - T0) // S: g for b, g in frame.group_by("bucket_ns").agg(pl.col("gpus").sum()).iter_rows()}
    observed = dict(frame.select((pl.col("bucket_ns") - T0) // S, pl.col("observed_ns") // S).unique().iter_rows())
    assert observed == {0: 43, 60: 60, 120: 60} and total == {0: (43 + 20) / 43, 60: 2.0, 120: (30 + 60) / 60}
    for seed in range(1, 6):
        rng = random.Random(seed)
        for case in range(6):
            path, batch, windows = tmp_path / f"r{seed}-{case}", SpanBatch(), {}
            for rep in ("A", "B", "C")[:rng.randint(1, 3)]:
                times = []
                for i in range(rng.randint(1, 3)):
                    start = rng.randint(0, 240) * S
                    g0, g1 = start + rng.randint(0, 5) * S, start + rng.randint(6, 90) * S
                    end = g1 + rng.randint(0, 5) * S
                    add_request(batch, f"{rep}{i}", start, end, [("generation", g0, g1)], replica=rep,
                                attrs=_tenant(rng.choice("xy")))
                    times += [start, end]
                windows[rep] = (min(times), max(times))
            write(path, batch)
            lo, hi = (rng.randint(0, 120) * S, rng.randint(150, 400) * S) if rng.random() < 0.5 else (None, None)
            frame = cost_series(connect(path), by="tenant", bucket_s=60, since=None if lo is None else T0 + lo,
                                until=None if hi is None else T0 + hi)
            clipped = [(max(a, lo if lo is not None else a), min(b, hi if hi is not None else b))
                       for a, b in windows.values()]
            clipped = [(a, b) for a, b in clipped if b > a]
            first, last = min(a for a, _ in clipped), max(b for _, b in clipped)

            def overlap(a: int, b: int, c: int) -> int:
                return max(0, min(b, c + 60 * S) - max(a, c))

            for c, got_obs, got_gpus, got_ns in frame.group_by("bucket_ns").agg(
                    pl.col("observed_ns").first(), pl.col("gpus").sum(), pl.col("gpu_ns").sum()).iter_rows():
                c -= T0
                want_ns = sum(overlap(a, b, c) for a, b in clipped)  # every replica's observed time in the cell
                assert (got_obs, got_ns) == (overlap(first, last, c), want_ns), (seed, case, c)
                assert got_gpus == pytest.approx(want_ns / overlap(first, last, c), rel=1e-12), (seed, case, c)


def test_prices_table_and_errors(tmp_path: Path) -> None:
    table = tmp_path / "prices.toml"
    table.write_text('gpu_hour_usd = 2.0\n[replica]\n"A" = 4.0\n[model]\nbig = 8.0\n')
    p = load_prices(table)
    assert (p.of("A", "big"), p.of("B", "big"), p.of("B", "small")) == (4.0, 8.0, 2.0)
    assert load_prices(table, gpu_hour_usd=1.0).default == 1.0
    assert prices_for(tmp_path).source == str(table)  # found beside the store
    table.write_text("gpu_hour_usd = -1\n")
    with pytest.raises(QueryError, match="non-negative"):
        load_prices(table)
    table.write_text("[gpu]\nx = 1\n")
    with pytest.raises(QueryError, match="unknown key"):
        load_prices(table)
    assert not prices_for(tmp_path / "elsewhere").known


def test_cli_json_text_and_errors(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from tailscope.cli import app

    store = tmp_path / "store"
    batch = SpanBatch()
    add_request(batch, "r1", 0, 10 * S, [("generation", 0, 10 * S)], replica="A", attrs=_tenant("x", 100))
    add_request(batch, "r2", 4 * S, 12 * S, [("generation", 4 * S, 10 * S)], replica="A", attrs=_tenant("y", 50))
    write(store, batch)
    runner = CliRunner()
    result = runner.invoke(app, ["cost", "--store", str(store), "--json", "--gpu-hour-usd", "3.6"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["version"], data["by"], data["gpu_hour_usd"]) == (1, "tenant", 3.6)
    assert {r["key"]: r["gpu_ns"] for r in data["rows"]} == {"x": 7 * S, "y": 3 * S}
    assert data["rows"][0]["cost_usd"] == pytest.approx(7 * 3.6 / 3600)
    assert data["replicas"] == [{
        "replica": "A", "observed_ns": 12 * S, "allocated_ns": 10 * S, "cold_start_ns": 0, "idle_ns": 2 * S,
        "observed_seconds": 12.0, "allocated_seconds": 10.0, "cold_start_seconds": 0.0, "idle_seconds": 2.0,
        "idle_share": 2 / 12, "gpu_hour_usd": 3.6, "overhead_usd": pytest.approx(2 * 3.6 / 3600)}]
    result = runner.invoke(app, ["cost", "--store", str(store), "--by", "replica", "--since",
                                 "2025-11-20T14:00:05Z"])
    assert result.exit_code == 0 and "no price" in result.stdout
    (store / "prices.toml").write_text("gpu_hour_usd = 'cheap'\n")
    result = runner.invoke(app, ["cost", "--store", str(store)])
    assert result.exit_code == 1 and "a price must be a non-negative number" in result.stderr
    result = runner.invoke(app, ["cost", "--store", str(tmp_path / "missing")])
    assert result.exit_code == 1 and "no store there" in result.stderr


def test_two_requests_of_one_trace_starting_at_the_same_ns_are_charged_apart(tmp_path: Path) -> None:
    # one trace, two request spans both starting at 0 on two replicas (a gateway fanning out): tenant x's
    # request generates 3 s on A, tenant y's 5 s on B; joining GPU shares to requests on (trace, start)
    # would give each tenant both
    batch = SpanBatch()
    trace = hex_id("trace", "fan", size=32)
    for key, replica, tenant, gen in (("a", "A", "x", 3 * S), ("b", "B", "y", 5 * S)):
        root = hex_id("span", "fan", key)
        resource = {"service.name": "llm", "service.instance.id": replica}
        batch.append(trace_id=trace, span_id=root, parent_span_id="", name="request", kind="Server",
                     start_ns=T0, end_ns=T0 + gen, service="llm", resource=resource,
                     attrs={"tailscope.request": "true", **_tenant(tenant, 10)})
        batch.append(trace_id=trace, span_id=hex_id("span", "fan", key, "gen"), parent_span_id=root,
                     name="generation", kind="Internal", start_ns=T0, end_ns=T0 + gen, service="llm",
                     resource=resource, attrs={"tailscope.stage": "generation"})
    write(tmp_path, batch)
    con = connect(tmp_path)
    out = cost_table(con, by="tenant", prices=Prices(default=1.0))
    rows = {r["key"]: r for r in out["rows"]}
    assert (rows["x"]["gpu_ns"], rows["y"]["gpu_ns"]) == (3 * S, 5 * S)
    assert (rows["x"]["requests"], rows["y"]["requests"]) == (1, 1)
    assert sum(r["gpu_ns"] for r in out["rows"]) == out["totals"]["allocated_ns"] == 8 * S
    by_model = cost_table(con, by="replica")
    assert {r["key"]: r["gpu_ns"] for r in by_model["rows"]} == {"A": 3 * S, "B": 5 * S}
    # an empty range: no requests, no GPU time, no error
    empty = cost_table(con, by="tenant", since=T0 + 100 * S, until=T0 + 200 * S)
    assert empty["rows"] == [] and empty["totals"]["allocated_ns"] == 0


def _sampled_pair(rng: random.Random, weighted: Path, expanded: Path) -> tuple[int, int]:
    """The same random requests twice: once kept with a `SampleRate` of 1-4, once as that many identical copies
    weighing 1 (the brute-force reference). Times in ms so that whole-ns rounding is small. Returns
    (copies, distinct boundaries)."""
    ms = 1_000_000
    wb, xb = SpanBatch(), SpanBatch()
    copies, bounds = 0, set()
    for i in range(rng.randint(2, 8)):
        start = rng.randint(0, 30)
        end = start + rng.randint(2, 25)
        g0 = rng.randint(start, end - 1)
        g1 = rng.randint(g0 + 1, end)
        stages: list[tuple[Any, ...]] = [("generation", g0 * ms, g1 * ms)]
        if rng.random() < 0.3:
            a = rng.randint(start, end - 1)
            stages.append(("model_load", a * ms, rng.randint(a + 1, end) * ms))
        bounds |= {start, end, g0, g1}
        replica, tenant = rng.choice(["A", "B"]), rng.choice(["x", "y", "z"])
        w = rng.randint(1, 4)
        attrs = _tenant(tenant, rng.randint(0, 500))
        add_request(wb, f"w{i}", start * ms, end * ms, stages, replica=replica, attrs={**attrs, "SampleRate": str(w)})
        for c in range(w):
            add_request(xb, f"x{i}-{c}", start * ms, end * ms, stages, replica=replica, attrs=attrs)
        copies += w
    write(weighted, wb)
    write(expanded, xb)
    return copies, len(bounds)


def test_sampled_gpu_time_equals_the_expanded_requests(tmp_path: Path) -> None:
    """A kept request with adjusted count w costs what its w copies cost: GPU ns, tokens, requests, tail per
    tenant, against the integer sweep over the copies. Both roundings are under 1 ns per request and segment
    (the copies' floor division, the weighted total's rounding), hence the bound."""
    rng = random.Random(18)
    for case in range(8):
        wp, xp = tmp_path / f"w{case}", tmp_path / f"x{case}"
        copies, bounds = _sampled_pair(rng, wp, xp)
        wcon, xcon = connect(wp), connect(xp)
        got, want = cost_table(wcon, by="tenant"), cost_table(xcon, by="tenant")
        assert got["sampled"] and not want["sampled"]
        tol = 2 * copies * bounds
        g, x = {r["key"]: r for r in got["rows"]}, {r["key"]: r for r in want["rows"]}
        assert set(g) == set(x)
        for k in g:
            assert abs(g[k]["gpu_ns"] - x[k]["gpu_ns"]) <= tol, (case, k)
            assert abs(g[k]["tail_gpu_ns"] - x[k]["tail_gpu_ns"]) <= tol, (case, k)
            assert g[k]["requests_weighted"] == x[k]["requests"]
            assert (g[k]["output_tokens"], g[k]["input_tokens"]) == (x[k]["output_tokens"], x[k]["input_tokens"])
        for a, b in zip(got["replicas"], want["replicas"], strict=True):
            assert (a["replica"], a["observed_ns"]) == (b["replica"], b["observed_ns"])
            for c in ("allocated_ns", "cold_start_ns", "idle_ns"):
                assert abs(a[c] - b[c]) <= tol, (case, c)
        series = cost_series(wcon, by="tenant", bucket_s=1)
        assert abs(int(series["gpu_ns"].sum()) - got["totals"]["observed_ns"]) <= tol
        wcon.close()
        xcon.close()


def test_every_weight_one_keeps_the_integer_sweep(tmp_path: Path) -> None:
    """SampleRate 1 everywhere: not sampled, the integer rule runs and its shares are whole ns, exactly."""
    batch = SpanBatch()
    add_request(batch, "r1", 0, 10 * S, [("generation", 0, 10 * S + 1)], replica="A",
                attrs={**_tenant("x"), "SampleRate": "1"})
    add_request(batch, "r2", 0, 10 * S, [("generation", 0, 10 * S)], replica="A", attrs=_tenant("y"))
    write(tmp_path, batch)
    out = cost_table(connect(tmp_path), by="tenant")
    assert not out["sampled"]
    rows = {r["key"]: r["gpu_ns"] for r in out["rows"]}
    assert rows == {"x": 5 * S + 1, "y": 5 * S}



def _ch_shares(client: Any, table: str, **kw: Any) -> tuple[dict[Any, int], dict[Any, tuple[int, ...]]]:
    shares, reps = clickhouse_gpu_shares(client, table, **kw)
    a = {(r["replica"], r["trace_id"], r["bucket_ns"]): r["allocated_ns"]
         for r in client.query(f"SELECT replica, trace_id, bucket_ns, allocated_ns FROM {shares}").to_pylist()}
    b: dict[Any, tuple[int, ...]] = {
        (r["replica"], r["bucket_ns"]): (r["observed_ns"], r["allocated_ns"], r["cold_start_ns"], r["idle_ns"])
         for r in client.query("SELECT replica, bucket_ns, observed_ns, allocated_ns, cold_start_ns, idle_ns "
                               f"FROM {reps}").to_pylist()}
    return a, b


def test_the_clickhouse_sweep_equals_duckdbs_on_a_sampled_store(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, chdb_client: Any) -> None:
    """The cold-start incident, whole (the integer rule) and as a quarter copy recording `ot=th` (the weighted
    rule), exported to chdb: the ClickHouse text of the sweep gives DuckDB's shares and replica times, with and
    without a window and a grid, and with cells narrower than the minute. Integer sweep: exactly. Weighted: the
    floats are summed in another order, so a request's rounded total may differ by 1 ns."""
    from analysis.clickhouse.export import export_store
    from tests.sample_traces import sampled_copy as SC

    data = Path(__file__).resolve().parents[2] / "sample_traces" / "data" / "incidents" / "cold_start.otlp.jsonl.gz"
    whole = samples_cache.store(data, tmp_path_factory)
    quarter = SC.write_store(tmp_path / "quarter", SC.consistent_sample(SC.read_spans(whole), lambda r: 0.25))
    for store, weighted, table in ((whole, False, "t_cost_whole"), (quarter, True, "t_cost_quarter")):
        chdb_client.command(f"DROP TABLE IF EXISTS {table}")
        export_store(store, chdb_client, table)
        con = connect(store)
        lo, hi = one(con, "SELECT min(start_ns), max(end_ns) FROM requests")
        tol = 1 if weighted else 0
        # the last two: cells of 7 s instead of the minute, so the cell edges cut many segments
        for kw in ({}, {"since": lo + (hi - lo) // 3, "until": lo + 2 * (hi - lo) // 3, "grid_ns": 60 * S},
                   {"cell_ns": 7 * S}, {"cell_ns": 7 * S, "grid_ns": 5 * S}):
            want_a, want_r = _shares(con, weighted=weighted, **kw)
            got_a, got_r = _ch_shares(chdb_client, table, **kw)
            assert sum(want_a.values()) > 0 and any(v[2] > 0 for v in want_r.values())
            assert set(got_a) == set(want_a) and set(got_r) == set(want_r), (table, kw)
            assert max(abs(got_a[k] - want_a[k]) for k in want_a) <= tol, (table, kw)
            for k, v in want_r.items():
                assert got_r[k][0] == v[0] and max(abs(g - w) for g, w in zip(got_r[k], v, strict=True)) <= (
                    tol * len(want_a)), (table, kw, k)
        con.close()


def test_the_cost_on_clickhouse_equals_the_stores(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, chdb_client: Any) -> None:
    """The cold-start incident in chdb: the cost table (every grouping, whole and in a range) and the series
    computed on the server equal DuckDB's; a sampled table is refused in one sentence."""
    import polars as pl

    from analysis import clickhouse as C
    from analysis.clickhouse.export import export_store
    from analysis.cost import clickhouse_cost
    from tests.sample_traces import sampled_copy as SC

    data = Path(__file__).resolve().parents[2] / "sample_traces" / "data" / "incidents" / "cold_start.otlp.jsonl.gz"
    whole = samples_cache.store(data, tmp_path_factory)
    table = "t_cost_table"
    chdb_client.command(f"DROP TABLE IF EXISTS {table}")
    export_store(whole, chdb_client, table)
    facts = C.materialize_requests(chdb_client, table, name="_cost_facts")
    con = connect(whole)
    lo, hi = one(con, "SELECT min(start_ns), max(end_ns) FROM requests")
    prices = Prices(2.5)
    for by, kw in itertools.product(("tenant", "model", "replica"), ({}, {"since": lo + (hi - lo) // 3,
                                                                         "until": lo + 2 * (hi - lo) // 3})):
        want = cost_table(con, by=by, prices=prices, **kw)
        assert want["rows"] and want["totals"]["allocated_ns"] > 0
        assert clickhouse_cost(chdb_client, facts, table, by=by, prices=prices, **kw) == want, (by, kw)
    want_s = cost_series(con, by="tenant", bucket_s=60, prices=prices)
    got_s = clickhouse_cost(chdb_client, facts, table, by="tenant", prices=prices, bucket_s=60)
    assert isinstance(got_s, pl.DataFrame) and want_s.height > 0
    assert got_s.to_dicts() == want_s.to_dicts()
    con.close()
    quarter = SC.write_store(tmp_path / "quarter", SC.consistent_sample(SC.read_spans(whole), lambda r: 0.25))
    chdb_client.command("DROP TABLE IF EXISTS t_cost_sampled")
    export_store(quarter, chdb_client, "t_cost_sampled")
    sampled = C.materialize_requests(chdb_client, "t_cost_sampled", name="_cost_facts_sampled")
    with pytest.raises(QueryError, match="sampled"):
        clickhouse_cost(chdb_client, sampled, "t_cost_sampled")
