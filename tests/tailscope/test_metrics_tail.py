"""`tailscope metrics --store` observes each span once, also when the compactor merges segments it has read."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from intake.compact.merge import Compactor, Policy
from tailscope.commands.metrics import StoreTail
from tests.intake.compact_helpers import rows, write_segments


class Observed:
    """Counts the spans a tail hands over (the SpanMetrics interface: observe(table))."""

    def __init__(self) -> None:
        self.spans = 0

    def observe(self, table: Any) -> None:
        self.spans += table.num_rows


def test_merged_segments_are_not_observed_again(tmp_path: Path) -> None:
    rng = random.Random(11)
    policy = Policy(fan_in=4, target_bytes=1 << 20, settle_s=300.0, quiet_s=60.0, grace_s=600.0,
                    row_group_spans=2048, durable=False)
    write_segments(tmp_path, rng, 9)
    c = Compactor(tmp_path, policy)
    seen = Observed()
    tail = StoreTail(tmp_path, seen, from_start=True)
    first = tail.poll()
    assert first == seen.spans == sum(rows(tmp_path).values())
    now = time.time() + 1000  # the sample hour ended long ago: a settled merge into one segment
    assert c.run_once(now).merges >= 1
    assert tail.poll() == 0 and seen.spans == first
    write_segments(tmp_path, rng, 2, tag="late")  # late spans, then their merge with what was counted
    late = tail.poll()
    assert late > 0 and seen.spans == first + late == sum(rows(tmp_path).values())
    assert c.run_once(now + 10_000).merges >= 1
    assert tail.poll() == 0 and seen.spans == sum(rows(tmp_path).values())


def test_a_tail_started_after_the_merges_counts_the_merged_segments(tmp_path: Path) -> None:
    write_segments(tmp_path, random.Random(12), 9)
    total = sum(rows(tmp_path).values())
    Compactor(tmp_path, Policy(fan_in=4, durable=False)).run_once(time.time() + 1000)
    seen = Observed()
    assert StoreTail(tmp_path, seen, from_start=True).poll() == total == seen.spans
