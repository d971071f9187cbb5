"""intake.otlp.promote (vectorized, once per commit group) against SpanBatch.append (rows.first_attr and
rows.attr_int per span) on random attribute maps: absent, empty and present values of every key
that a promoted column reads, in every order."""

from __future__ import annotations

import random

from intake.otlp import base_of, promote
from tracing import schema as S
from tracing.rows import SpanBatch, ttft_ns_of

KEYS = (*S.MODEL_KEYS, *S.MODEL_VERSION_KEYS, *S.TENANT_KEYS, *S.INPUT_TOKEN_KEYS, *S.OUTPUT_TOKEN_KEYS,
        S.ATTR_TTFT_NS, S.ATTR_TIME_TO_FIRST_CHUNK, "unrelated.key")
VALUES = ("", "m1", "m2", "12", "-7", "3.5", "x9", " 4", "0.25", "0.1234567895", "1e-3", "0.0000000005", "7.")


def first_attr(attrs: dict[str, str], keys: tuple[str, ...]) -> str | None:
    """The reference: the first key whose value is there and not empty."""
    return next((attrs[k] for k in keys if attrs.get(k, "") != ""), None)


def test_promoted_columns_equal_the_per_span_rules_on_random_attributes() -> None:
    rng = random.Random(2026)
    for _round in range(30):
        rows = []
        for _ in range(rng.randint(0, 300)):
            keys = rng.sample(KEYS, rng.randint(0, len(KEYS)))
            rows.append({k: rng.choice(VALUES) for k in keys})
        batch = SpanBatch()
        for i, attrs in enumerate(rows):
            batch.append(trace_id=f"{i:032x}", span_id=f"{i:016x}", parent_span_id="", name="r", kind="Server",
                         start_ns=10 * i, end_ns=10 * i + 5, service="s", resource={}, attrs=attrs)
        table = batch.to_table()
        promoted = promote(base_of(table))
        assert promoted.equals(table)
        assert promoted.column("Model").to_pylist() == [first_attr(a, S.MODEL_KEYS) for a in rows]
        assert promoted.column("Tenant").to_pylist() == [first_attr(a, S.TENANT_KEYS) for a in rows]
        assert promoted.column("ModelVersion").to_pylist() == [first_attr(a, S.MODEL_VERSION_KEYS) for a in rows]
        assert promoted.column("TtftNs").to_pylist() == [ttft_ns_of(a) for a in rows]
