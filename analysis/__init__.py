"""tailscope analysis: query a segment store and explain its tail latency.

`connect(store)` gives a DuckDB connection with the documented views (`spans`,
`requests`, `stages`); see docs/schema.md for every column.
"""

from analysis.engine.connect import connect, refresh
from analysis.engine.percentiles import percentile_series, request_facts
from analysis.report import build_report, render_text
from analysis.stats.spikes import detect
from analysis.whatif import simulate, whatif

__all__ = ["build_report", "connect", "detect", "percentile_series", "refresh", "render_text", "request_facts",
           "simulate", "whatif"]
