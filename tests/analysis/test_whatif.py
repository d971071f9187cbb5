"""What-if replay: the heap simulator agrees with a tick-by-tick oracle, and known queues give known waits."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from analysis import connect
from analysis.whatif import oracle, predict, simulate, whatif
from tests.factory import add_request, write
from tracing.rows import SpanBatch

MS = 1_000_000


def test_known_queues() -> None:
    assert simulate([0, 0, 0], [10, 10, 10], 1).tolist() == [10, 20, 30]
    assert simulate([0, 0, 0], [10, 10, 10], 2).tolist() == [10, 10, 20]
    assert simulate([0, 0, 0], [10, 10, 10], 5).tolist() == [10, 10, 10]
    # input order is kept even when arrivals are not sorted; ties keep input order (FIFO)
    assert simulate([5, 0, 0], [1, 4, 4], 1).tolist() == [4, 4, 8]
    assert simulate([], [], 3).tolist() == []
    with pytest.raises(ValueError):
        simulate([0], [1], 0)
    with pytest.raises(ValueError):
        simulate([0], [-1], 1)


def test_simulator_matches_tick_oracle_on_random_workloads() -> None:
    rng = random.Random(11)
    for _ in range(400):
        n = rng.randint(1, 25)
        servers = rng.randint(1, 5)
        arrivals = [rng.randint(0, 30) for _ in range(n)]
        services = [rng.randint(0, 12) for _ in range(n)]
        assert simulate(arrivals, services, servers).tolist() == oracle(arrivals, services, servers), (
            arrivals, services, servers)


def test_predict_reports_p50_p99_per_server_count() -> None:
    arrivals = np.zeros(4, dtype=np.int64)
    services = np.full(4, 10 * MS, dtype=np.int64)
    out = predict(arrivals, services, [1, 4])
    # one server: 10, 20, 30, 40 ms; four: all 10 ms
    assert out[0] == {"servers": 1, "p50_ms": 25.0, "p99_ms": pytest.approx(39.7)}
    assert out[1] == {"servers": 4, "p50_ms": 10.0, "p99_ms": 10.0}


def test_whatif_replays_the_store_without_its_queue_wait(tmp_path: Path) -> None:
    batch = SpanBatch()
    for i in range(3):  # three requests at once, 100 ms of work each, queued behind each other
        add_request(batch, i, 0, (i + 1) * 100 * MS, [
            ("queue_wait", 0, i * 100 * MS),
            ("generation", i * 100 * MS, (i + 1) * 100 * MS),
        ])
    write(tmp_path, batch)
    con = connect(tmp_path)
    one, three = whatif(con, [1, 3])
    assert one["p50_ms"] == 200.0  # the observed queue is replayed exactly
    assert three == {"servers": 3, "p50_ms": 100.0, "p99_ms": 100.0}
    # by default: the observed peak in service (one at a time here), then more
    assert [r["servers"] for r in whatif(con)] == [1, 2]
    assert whatif(con)[0] == one
