"""Readers keep working while another process writes segments into the same store."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from analysis import connect, refresh
from tests.factory import add_request, write
from tests.sql import one
from tracing.rows import SpanBatch

WRITER = """
import sys
from pathlib import Path
from tests.factory import add_request
from tracing.rows import SpanBatch
from tracing.store import SegmentWriter

store, rounds = Path(sys.argv[1]), int(sys.argv[2])
writer = SegmentWriter(store, kind="writer")
for r in range(rounds):
    batch = SpanBatch()
    for i in range(200):
        add_request(batch, (r, i), i * 1000, i * 1000 + 500, [("queue_wait", i * 1000, i * 1000 + 100),
                                                              ("generation", i * 1000 + 100, i * 1000 + 500)])
    writer.write(batch.to_table())
"""


def test_reader_during_writes_sees_only_whole_segments(tmp_path: Path) -> None:
    seed = SpanBatch()
    add_request(seed, "seed", 0, 10, [])
    write(tmp_path, seed)
    rounds = 40
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(rounds)], cwd=Path(__file__).parents[2])
    counts: list[int] = []
    deadline = time.monotonic() + 120
    long_lived = connect(tmp_path)
    try:
        while time.monotonic() < deadline and len(counts) < 2000:
            # alternate a fresh connection with a long-lived one refreshed in place
            con = connect(tmp_path) if len(counts) % 2 else long_lived
            if con is long_lived:
                refresh(con, tmp_path)
            n, spans, bad = one(
                con, "SELECT count(*), (SELECT count(*) FROM spans), "
                "count(*) FILTER (WHERE queue_wait_ns + generation_ns + other_ns <> e2e_ns) FROM requests")
            if con is not long_lived:
                con.close()
            assert bad == 0
            assert spans == 1 + 3 * (n - 1)   # whole requests only: never a partial segment
            counts.append(n)
            if proc.poll() is not None and n == 1 + rounds * 200:
                break
    finally:
        proc.wait(timeout=120)
    assert proc.returncode == 0
    assert counts == sorted(counts)          # counts only grow
    assert counts[-1] == 1 + rounds * 200
    assert len(set(counts)) > 2              # the reader really overlapped the writer
