"""Reading how many requests a sampled span stands for: `ot=th` in TraceState, a sample-rate attribute, else 1.

The rule (tracing.rows.sampling_of) is compared with a plain reference written from the
OpenTelemetry spec text (TraceState: Probability Sampling) on many random tracestates.
"""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

from tracing import schema as S
from tracing.rows import SpanBatch, adjusted_count_of, sampling_of

TWO56 = 2**56


def reference(trace_state: str, attrs: dict[str, str]) -> tuple[float, bool]:
    """Plain reading: split members, find the first ot=..., its first th:..., else SampleRate/sampling.rate."""
    members = [m.strip(" \t") for m in trace_state.split(",")]
    ot_value = None
    for m in members:
        if m.startswith("ot="):
            ot_value = m[3:]
            break
    th_text = None
    if ot_value is not None:
        for part in ot_value.split(";"):
            if part.startswith("th:"):
                th_text = part[3:]
                break
    if th_text is not None:
        ok = 1 <= len(th_text) <= 14 and all(ch in "0123456789abcdef" for ch in th_text)
        if not ok:
            return 1.0, True
        th = int(th_text + "0" * (14 - len(th_text)), 16)
        return float(TWO56) / float(TWO56 - th), False
    for key in ("SampleRate", "sampling.rate"):
        text = attrs.get(key, "")
        if text == "":
            continue
        head, _, tail = text.partition(".")
        digits_ok = head.isascii() and head.isdigit() and 1 <= len(head) <= 18 and (
            "." not in text or (tail.isascii() and tail.isdigit() and 1 <= len(tail) <= 18))
        if not digits_ok or float(text) < 1:
            return 1.0, True
        return float(text), False
    return 1.0, False


@pytest.mark.parametrize(("state", "count"), [
    ("", 1.0), ("ot=th:0", 1.0), ("ot=th:8", 2.0), ("ot=th:c", 4.0), ("ot=th:e", 8.0),
    ("ot=th:f", 16.0), ("ot=rv:0123456789abcd;th:c", 4.0), ("vendor=abc,ot=th:8", 2.0),
    ("vendor=abc , ot=th:8 ,other=1", 2.0), ("ot=th:fffffffffffff", float(2**52)),
    ("ot=th:ffffffffffffff", float(2**56)), ("ot=th:e666666666666", float(Fraction(2**56, 2**56 - 0xe6666666666660))),
])
def test_thresholds_of_every_precision(state: str, count: float) -> None:
    assert sampling_of(state, None) == (count, False)


@pytest.mark.parametrize("state", ["ot=th:", "ot=th:G", "ot=th:ABC", "ot=th:123456789abcdef", "ot=th:8 ;rv:1x",
                                   "ot=th:-1", "ot=th:0x8"])
def test_malformed_thresholds_weigh_one_and_are_flagged(state: str) -> None:
    assert sampling_of(state, "10") == (1.0, True)


def test_rates_and_their_order() -> None:
    assert sampling_of("", "10") == (10.0, False)
    assert sampling_of("ot=rv:abc", "10") == (10.0, False)   # an ot entry without th leaves the rate
    assert sampling_of("ot=th:8", "10") == (2.0, False)      # the threshold wins
    assert sampling_of("", "2.5") == (2.5, False)
    assert sampling_of("", "1") == (1.0, False)
    for bad in ("0", "0.5", "-3", "1e3", "ten", " 10", "10\n", "inf", "nan", "1_000"):
        assert sampling_of("", bad) == (1.0, True), bad
    assert adjusted_count_of("", {"sampling.rate": "4"}) == 4.0
    assert adjusted_count_of("", {"SampleRate": "", "sampling.rate": "4"}) == 4.0
    assert adjusted_count_of("", {"SampleRate": "3", "sampling.rate": "4"}) == 3.0
    assert adjusted_count_of("", {}) == 1.0


def random_state(rng: random.Random) -> str:
    """Tracestates built from the pieces that matter, with the separators and spaces that trip parsers."""
    def th() -> str:
        n = rng.choice([0, 1, 1, 2, 3, 7, 13, 14, 14, 15])
        alphabet = "0123456789abcdef" if rng.random() < 0.85 else "0123456789abcdefABG-x "
        return "".join(rng.choice(alphabet) for _ in range(n))

    def ot() -> str:
        parts = []
        for _ in range(rng.randint(0, 3)):
            kind = rng.random()
            parts.append(f"th:{th()}" if kind < 0.6 else f"rv:{th()}" if kind < 0.8 else "x:1")
        return ";".join(parts)

    members = []
    for _ in range(rng.randint(0, 3)):
        pad = rng.choice(["", " ", "\t", "  "])
        other = rng.choice(["vendor=v", "a@b=c", "ott=th:8"])
        members.append(pad + (f"ot={ot()}" if rng.random() < 0.7 else other) + pad)
    return ",".join(members)


def random_attrs(rng: random.Random) -> dict[str, str]:
    attrs: dict[str, str] = {}
    for key in ("SampleRate", "sampling.rate"):
        if rng.random() < 0.4:
            attrs[key] = rng.choice(["", "1", "10", "2.5", "0.5", "100", "abc", "20.", "3.25", "0", "7"])
    return attrs


def test_rule_equals_the_reference_on_random_tracestates() -> None:
    rng = random.Random(18)
    for _ in range(20_000):
        state, attrs = random_state(rng), random_attrs(rng)
        rate = next((attrs[k] for k in S.SAMPLE_RATE_KEYS if attrs.get(k)), None)
        assert sampling_of(state, rate) == reference(state, attrs), (state, attrs)


def test_span_batch_promotes_the_adjusted_count() -> None:
    batch = SpanBatch()
    for state, attrs in (("ot=th:c", {}), ("", {"SampleRate": "10"}), ("", {})):
        batch.append(trace_id="a" * 32, span_id="b" * 16, parent_span_id="", name="r", kind="Server", start_ns=1,
                     end_ns=2, service="s", resource={}, attrs=attrs, trace_state=state)
    assert batch.to_table().column("AdjustedCount").to_pylist() == [4.0, 10.0, 1.0]
