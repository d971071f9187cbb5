"""dashboard.charts: one colour per stage, latency formatting."""

from __future__ import annotations

import pytest

from dashboard import charts
from tracing import schema as S


def test_every_critical_path_stage_has_one_distinct_colour() -> None:
    assert list(charts.STAGE_COLORS) == list(S.CRITICAL_PATH_COLUMNS)
    assert len(set(charts.STAGE_COLORS.values())) == len(charts.STAGE_COLORS)
    assert charts.stage_scale().to_dict() == {"domain": list(S.CRITICAL_PATH_COLUMNS),
                                              "range": list(charts.STAGE_COLORS.values())}


@pytest.mark.parametrize(("ms", "text"), [
    (None, "–"), (float("nan"), "–"), (0.4, "0 ms"), (850.0, "850 ms"), (2_449.0, "2.4 s"),
    (38_000.0, "38 s"), (-8_790.0, "-8.8 s"), (-120.0, "-120 ms"), (125_000.0, "125 s"),
])
def test_fmt_ms(ms: float | None, text: str) -> None:
    assert charts.fmt_ms(ms) == text


def test_token_buckets_are_labelled_as_the_report_labels_them() -> None:
    """The chart shows analysis' own bucket labels unchanged (the dashboard never relabels)."""
    import pandas as pd

    from analysis.explain import bucket_bounds, bucket_label

    lows = [0, 1, 2, 1024]
    df = pd.DataFrame({"input_tokens_bucket": [bucket_label(*bucket_bounds(lo)) for lo in lows],
                       "input_tokens_lo": lows, "requests": [1, 2, 3, 4],
                       "p50_ms": [1.0] * 4, "p99_ms": [2.0] * 4})
    chart = charts.bucket_p99(df, "input_tokens", "input tokens")
    labels = sorted(set(chart.data["bucket"]), key=lambda s: int(s.split("-")[0]))
    assert labels == ["0-0", "1-1", "2-3", "1024-2047"]
