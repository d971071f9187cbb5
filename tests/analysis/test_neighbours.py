"""Noisy neighbours: a tenant's burst that queues the others is named; a capacity loss that queues everyone is not."""

from __future__ import annotations

import heapq
import random
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from analysis import connect
from analysis.report import build_report, render_text
from intake.ingest import ingest_files
from tests.factory import add_request, write
from tracing.rows import SpanBatch

MS = 1_000_000
S = 1_000_000_000
MINUTES = 20
SLOTS = 4


def _fleet(path: Path, burst: bool, outage: bool, sample_rate: str | None = None) -> None:
    """Two replicas of SLOTS FIFO slots; tenants a, b, c at 14/s, x at 0.5/s; minutes 10-13 perturbed.

    burst: x also fires 16 requests at once every 10 s. outage: replica r1 is slow to take requests and the
    router sends it only a third of them (r0 runs hotter: everyone queues a little more).
    """
    rng = random.Random(21)
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
        add_request(batch, i, a, begin + service, [("queue_wait", a, begin), ("generation", begin, begin + service)],
                    replica=rep, attrs={"tailscope.tenant": tenant, "gen_ai.usage.output_tokens": "10",
                                        **({"SampleRate": sample_rate} if sample_rate else {})})
    write(path, batch)


def _spikes(path: Path) -> list[dict[str, Any]]:
    con = connect(path)
    report = build_report(con, window_s="60s")
    assert not report["errors"], report["errors"]
    _says_in_text(report)
    return list(report["spikes"])


def _says_in_text(report: dict[str, Any]) -> None:
    """The text report carries each spike's noisy-neighbour sentence when there is one, and nothing otherwise."""
    console = Console(record=True, width=1000)
    render_text(report, console)
    text = console.export_text()
    said = [s["noisy_neighbour"]["sentence"] for s in report["spikes"] if s.get("noisy_neighbour")]
    assert text.count("noisy neighbour: ") == len(said)
    for sentence in said:
        assert f"noisy neighbour: {sentence}" in text


def test_a_tenant_burst_that_queues_the_others_is_named(tmp_path: Path) -> None:
    _fleet(tmp_path, burst=True, outage=False)
    spikes = _spikes(tmp_path)
    assert spikes and spikes[0]["stages"][0]["stage"] == "queue_wait"
    found = spikes[0]["noisy_neighbour"]
    assert found is not None
    assert found["tenant"] == "x"
    assert found["admitted_share"]["spike"] > 1.5 * found["admitted_share"]["baseline"]
    assert found["gpu_share"]["spike"] > found["gpu_share"]["baseline"]
    assert found["victims"] == ["a", "b", "c"]
    assert found["sentence"].startswith("tenant x's burst pushed tenant a, b, c's queue")
    # the dashboard's report (request facts from a `source` relation) names the same neighbour
    via_source = build_report(connect(tmp_path), window_s="60s", source="requests")
    assert via_source["spikes"][0]["noisy_neighbour"] == found, via_source["spikes"][0]["errors"]


def test_equal_adjusted_counts_name_the_same_neighbour(tmp_path: Path) -> None:
    """Every request weighing 4 (the weighted path: shares of adjusted counts, the bound on the effective count)
    is the same population in other units: the same tenant, shares, victims and own share."""
    _fleet(tmp_path / "plain", burst=True, outage=False)
    _fleet(tmp_path / "weighted", burst=True, outage=False, sample_rate="4")
    plain, weighted = _spikes(tmp_path / "plain")[0], _spikes(tmp_path / "weighted")[0]
    assert weighted["requests_weighted"] == 4 * plain["requests"]
    a, b = plain["noisy_neighbour"], weighted["noisy_neighbour"]
    assert a is not None and b is not None
    for k in ("tenant", "replicas", "admitted_share", "victims", "tail_share_own", "sentence"):
        assert a[k] == b[k], k


def test_a_capacity_loss_that_queues_everyone_names_no_tenant(tmp_path: Path) -> None:
    _fleet(tmp_path, burst=False, outage=True)
    spikes = _spikes(tmp_path)
    assert spikes and spikes[0]["stages"][0]["stage"] == "queue_wait"
    assert spikes[0]["noisy_neighbour"] is None


SAMPLES = Path(__file__).parents[2] / "sample_traces" / "data" / "incidents"


@pytest.mark.parametrize("name", ["queue_backlog", "clean", "slow_replica"])
def test_sample_incidents(tmp_path: Path, name: str) -> None:
    ingest_files([SAMPLES / f"{name}.otlp.jsonl.gz"], tmp_path)
    report = build_report(connect(tmp_path))
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
