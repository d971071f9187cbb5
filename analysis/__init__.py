"""tailscope analysis: query a segment store and explain its tail latency.

`connect(store)` gives a DuckDB connection with the documented views (`spans`,
`requests`, `stages`); see docs/schema.md for every column.
"""

from analysis.connect import connect, refresh

__all__ = ["connect", "refresh"]
