"""The cold-start carrying study (`tests.sample_traces.quarter_power`) on two seeds: at full rate the cold start lifts
its 60 s window's p99 far beyond the 20 % rise and beyond the clean runs' largest window rise (the figures docs/demo.md
records for 60 seeds), and its counts are of the requests it names."""

from __future__ import annotations

from tests.sample_traces.quarter_power import study


def test_at_full_rate_the_cold_start_stands_out_on_every_seed() -> None:
    got = study(2, 600.0, 60.0, 1.0)
    assert all(c >= 2.0 for c in got["cold"]), got
    assert min(got["cold"]) > max(got["null"]) and max(got["null"]) < 1.5, got
    assert all(a >= 10 for a in got["above"]), got  # of about 27 requests routed to the replica while it loads
