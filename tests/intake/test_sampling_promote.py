"""The two promotion twins agree on AdjustedCount: SpanBatch.append (per span) and intake.otlp.promote (vectorized)."""

from __future__ import annotations

import random

from intake.otlp import base_of, promote
from tests.tracing.test_sampling import random_attrs, random_state, reference
from tracing.rows import SpanBatch


def _batch(rows: list[tuple[str, dict[str, str]]]) -> SpanBatch:
    batch = SpanBatch()
    for i, (state, attrs) in enumerate(rows):
        batch.append(trace_id=f"{i:032x}", span_id=f"{i:016x}", parent_span_id="", name="r", kind="Server",
                     start_ns=10 * i, end_ns=10 * i + 5, service="s", resource={}, attrs=attrs, trace_state=state)
    return batch


def test_promote_equals_span_batch_and_the_reference_on_random_spans() -> None:
    rng = random.Random(1818)
    for round_ in range(40):
        n = rng.randint(0, 400)
        plain = round_ % 4 == 0  # every fourth batch carries no sampling information at all (the fast path)
        rows = [("", {}) if plain else (random_state(rng), random_attrs(rng)) for _ in range(n)]
        table = _batch(rows).to_table()
        promoted = promote(base_of(table))
        assert promoted.schema == table.schema
        want = [reference(state, attrs)[0] for state, attrs in rows]
        assert table.column("AdjustedCount").to_pylist() == want
        assert promoted.column("AdjustedCount").to_pylist() == want
        assert promoted.equals(table)
