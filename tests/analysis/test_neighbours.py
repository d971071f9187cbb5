"""Noisy neighbours: a tenant's burst that queues the others is named; a capacity loss that queues everyone is not."""

from __future__ import annotations

import heapq
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import polars as pl
import pytest
from rich.console import Console

from analysis import connect
from analysis import neighbours as N
from analysis.contract import Report, Spike
from analysis.engine.percentiles import weighted_quantile_sorted
from analysis.report import build_report, render_text
from tests import samples_cache
from tests.factory import add_request, write
from tracing.rows import SpanBatch

MS = 1_000_000
S = 1_000_000_000
MINUTES = 20
SLOTS = 4


def _fleet(path: Path, burst: bool, outage: bool, sample_rate: str | None = None,
           weigh: dict[str, tuple[int, ...]] | None = None, expand: bool = False) -> None:
    """Two replicas of SLOTS FIFO slots; tenants a, b, c at 14/s, x at 0.5/s; minutes 10-13 perturbed.

    burst: x also fires 16 requests at once every 10 s. outage: replica r1 is slow to take requests and the
    router sends it only a third of them (r0 runs hotter: everyone queues a little more).
    weigh: each request's adjusted count drawn from its tenant's choices (a second generator, so the fleet is
    the same), kept once with that `SampleRate`, or with `expand` written as that many copies weighing 1.
    """
    rng = random.Random(21)
    wrng = random.Random(22)
    arrivals: list[tuple[int, str]] = []
    t = 0.0
    while t < MINUTES * 60:
        t += rng.expovariate(14.5)
        arrivals.append((int(t * S), rng.choice("abc") if rng.random() < 14 / 14.5 else "x"))
    if burst:
        for k in range(18):
            at = (600 + 10 * k) * S
            arrivals += [(at + i * MS, "x") for i in range(16)]
    arrivals.sort()
    free = {"r0": [0] * SLOTS, "r1": [0] * SLOTS}
    batch = SpanBatch()
    for i, (a, tenant) in enumerate(arrivals):
        down = outage and 600 * S <= a < 780 * S
        rep = ("r0" if rng.random() < 2 / 3 else "r1") if down else rng.choice(["r0", "r1"])
        begin = max(a, free[rep][0])
        service = rng.randint(200, 400) * MS
        heapq.heapreplace(free[rep], begin + service)
        attrs = {"tailscope.tenant": tenant, "gen_ai.usage.output_tokens": "10"}
        rate = sample_rate
        if weigh is not None:
            rate = str(wrng.choice(weigh[tenant]))
        for c in range(int(rate) if expand and rate else 1):
            add_request(batch, (i, c) if expand else i, a, begin + service,
                        [("queue_wait", a, begin), ("generation", begin, begin + service)], replica=rep,
                        attrs=attrs if expand else {**attrs, **({"SampleRate": rate} if rate else {})})
    write(path, batch)


#: Tenant x kept whole, a, b and c sampled with adjusted counts 1-4 (drawn per request).
WEIGH: dict[str, tuple[int, ...]] = {"a": (1, 2, 3, 4), "b": (2, 4), "c": (1, 3), "x": (1,)}
#: The fleets several tests read (test_clickhouse_rows.py too): `_fleet`'s keyword arguments by name.
FLEETS: dict[str, dict[str, Any]] = {
    "burst": {"burst": True, "outage": False},
    "burst-rate-4": {"burst": True, "outage": False, "sample_rate": "4"},
    "burst-weighed": {"burst": True, "outage": False, "weigh": WEIGH},
    "burst-weighed-expanded": {"burst": True, "outage": False, "weigh": WEIGH, "expand": True},
}


def fleet(name: str, factory: pytest.TempPathFactory) -> Path:
    """The store of FLEETS[name], built once per test session (samples_cache.built); read only."""
    return samples_cache.built(f"neighbours-{name}", lambda path: _fleet(path, **FLEETS[name]), factory)


def _spikes(path: Path) -> list[Spike]:
    con = connect(path)
    report = build_report(con, window_s="60s")
    assert not report["errors"], report["errors"]
    _says_in_text(report)
    return list(report["spikes"])


def _says_in_text(report: Report) -> None:
    """The text report carries each spike's noisy-neighbour sentence when there is one, and nothing otherwise."""
    console = Console(record=True, width=1000)
    render_text(report, console)
    text = console.export_text()
    said = [nn["sentence"] for s in report["spikes"] if (nn := s.get("noisy_neighbour"))]
    assert text.count("noisy neighbour: ") == len(said)
    for sentence in said:
        assert f"noisy neighbour: {sentence}" in text


def test_a_tenant_burst_that_queues_the_others_is_named(tmp_path_factory: pytest.TempPathFactory) -> None:
    path = fleet("burst", tmp_path_factory)
    spikes = _spikes(path)
    assert spikes and spikes[0]["stages"][0]["stage"] == "queue_wait"
    found = spikes[0]["noisy_neighbour"]
    assert found is not None
    assert found["tenant"] == "x"
    assert found["admitted_share"]["spike"] > 1.5 * found["admitted_share"]["baseline"]
    assert found["gpu_share"]["spike"] > found["gpu_share"]["baseline"]
    assert found["victims"] == ["a", "b", "c"]
    assert found["sentence"].startswith("tenant x's burst pushed tenant a, b, c's queue")
    # the dashboard's report (request facts from a `source` relation) names the same neighbour
    via_source = build_report(connect(path), window_s="60s", source="requests")
    assert via_source["spikes"][0]["noisy_neighbour"] == found, via_source["spikes"][0]["errors"]


def test_equal_adjusted_counts_name_the_same_neighbour(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every request weighing 4 (the weighted path: shares of adjusted counts, the bound on the effective count)
    is the same population in other units: the same tenant, shares, victims and own share."""
    plain = _spikes(fleet("burst", tmp_path_factory))[0]
    weighted = _spikes(fleet("burst-rate-4", tmp_path_factory))[0]
    assert weighted["requests_weighted"] == 4 * plain["requests"]
    a, b = plain["noisy_neighbour"], weighted["noisy_neighbour"]
    assert a is not None and b is not None
    for k in ("tenant", "replicas", "admitted_share", "victims", "tail_share_own", "sentence"):
        assert a[k] == b[k], k


def _neighbour_of(path: Path) -> tuple[dict[str, Any] | None, float]:
    """noisy_neighbour on the burst minutes 10-13 of a 60 s window store, the other windows as baseline, and
    queue_wait leading; the baseline p99 is the store's (weighted) p99 of the minutes before. Also returns
    the spike's tail share of tenant x counted per stored request (the unweighted reading)."""
    from analysis.report import _frame

    con = connect(path)
    frame, _, facts, _ = _frame(con, "e2e", None, None, True)
    start = frame.get_column("start_ns").to_numpy()
    t0 = int(start.min()) // (60 * S) * (60 * S)
    spike = SimpleNamespace(start_ns=t0 + 600 * S, end_ns=t0 + 780 * S, baseline_p99_ns=0.0)
    before = frame.filter(pl.col("start_ns") < spike.start_ns)
    w = before.get_column("weight") if "weight" in before.columns else pl.Series([1.0] * before.height)
    order = np.argsort(before.get_column("value").to_numpy(), kind="stable")
    spike.baseline_p99_ns = weighted_quantile_sorted(before.get_column("value").to_numpy()[order],
                                                     w.to_numpy().astype(np.float64)[order], 0.99)
    starts = np.arange(t0, t0 + MINUTES * 60 * S, 60 * S, dtype=np.int64)
    det = SimpleNamespace(window_ns=60 * S, window_start_ns=starts,
                          baseline=(starts < spike.start_ns) | (starts >= spike.end_ns))
    item = {"stages": [{"stage": "queue_wait", "share": 0.9}]}
    found = N.noisy_neighbour(con, facts, frame, cast(Any, det), cast(Any, spike), item)
    in_spike = frame.filter((pl.col("start_ns") >= spike.start_ns) & (pl.col("start_ns") < spike.end_ns)
                            & (pl.col("value") > spike.baseline_p99_ns))
    # a boolean Series' mean: a float, None when empty (polars types it as any Python literal)
    naive = cast(float | None, (in_spike.get_column("tenant").cast(pl.String) == "x").mean()) or 0.0
    con.close()
    return found, naive


@pytest.mark.slow
def test_unequal_adjusted_counts_name_what_the_expanded_requests_name(tmp_path_factory: pytest.TempPathFactory
                                                                      ) -> None:
    """Tenant x kept whole, a, b and c sampled with adjusted counts 1-4 (drawn per request): the weighted rule
    gives what the brute force gives, the same fleet written with each request repeated its adjusted count of
    times: the tenant, the replicas, its admitted and GPU shares, the tail's own share and the victims. Counting
    each kept request once would shrink the others: the tail's own share differs."""
    got, naive = _neighbour_of(fleet("burst-weighed", tmp_path_factory))
    want, _ = _neighbour_of(fleet("burst-weighed-expanded", tmp_path_factory))
    assert got is not None and want is not None
    for k in ("tenant", "replicas", "admitted_share", "tail_share_own", "victims", "sentence"):
        assert got[k] == want[k], k
    for k in ("spike", "baseline"):  # the copies' integer shares against the float weighted ones: rounding
        assert abs(got["gpu_share"][k] - want["gpu_share"][k]) <= 1e-4
    assert got["tenant"] == "x" and want["victims"] == ["a", "b", "c"]
    assert abs(naive - got["tail_share_own"]) > 0.05


def test_a_capacity_loss_that_queues_everyone_names_no_tenant(tmp_path: Path) -> None:
    _fleet(tmp_path, burst=False, outage=True)
    spikes = _spikes(tmp_path)
    assert spikes and spikes[0]["stages"][0]["stage"] == "queue_wait"
    assert spikes[0]["noisy_neighbour"] is None


SAMPLES = Path(__file__).parents[2] / "sample_traces" / "data" / "incidents"


@pytest.mark.parametrize("name", ["queue_backlog", "clean", "slow_replica"])
def test_sample_incidents(tmp_path_factory: pytest.TempPathFactory, name: str) -> None:
    report = build_report(connect(samples_cache.store(SAMPLES / f"{name}.otlp.jsonl.gz", tmp_path_factory)))
    _says_in_text(report)
    found = [s["noisy_neighbour"] for s in report["spikes"]]
    if name == "queue_backlog":  # cyberdyne's burst, queued by its own concurrency limit at the gateway
        assert len(found) == 1 and found[0] is not None
        assert found[0]["tenant"] == "cyberdyne" and found[0]["victims"] == []
        assert found[0]["sentence"].startswith("tenant cyberdyne's burst queued its own requests")
    elif name == "clean":
        assert found == []
    else:  # a decode spike: queue wait is not the excess, so nothing is said
        assert found == [None]
