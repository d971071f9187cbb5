"""tailscope analysis: query a segment store and explain its tail latency.

`connect(store)` gives a DuckDB connection with the documented views (`spans`,
`requests`, `stages`); see docs/schema.md for every column.

The public names below are imported on first use: a command that needs one module of the package
(`tailscope sql`, `store`, `ingest`) does not load the report, the detector and polars with it.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from analysis.engine.connect import connect, refresh
    from analysis.engine.percentiles import percentile_series, request_facts
    from analysis.report import build_report, render_text
    from analysis.stats.spikes import detect
    from analysis.whatif import simulate, whatif

#: public name -> the module that owns it
_HOME = {"connect": "analysis.engine.connect", "refresh": "analysis.engine.connect",
         "percentile_series": "analysis.engine.percentiles", "request_facts": "analysis.engine.percentiles",
         "build_report": "analysis.report", "render_text": "analysis.report", "detect": "analysis.stats.spikes",
         "simulate": "analysis.whatif", "whatif": "analysis.whatif"}

__all__ = ["build_report", "connect", "detect", "percentile_series", "refresh", "render_text", "request_facts",
           "simulate", "whatif"]


if not TYPE_CHECKING:  # hidden from type checkers, which would otherwise type every unknown name as Any

    def __getattr__(name: str) -> Any:
        """A public name, its module imported on first use."""
        if name not in _HOME:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        return getattr(importlib.import_module(_HOME[name]), name)


class _Package(types.ModuleType):
    """The package's module: `analysis.whatif` stays the function, as when every name was imported up front (the
    import system sets each submodule loaded as an attribute of its package; the submodule analysis.whatif is
    `sys.modules["analysis.whatif"]`)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if not (name in _HOME and isinstance(value, types.ModuleType)):
            super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
