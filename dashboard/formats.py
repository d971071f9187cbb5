"""How numbers read on every page: column headers in words, units, thousands separators, no None or nan.

Tables use these `st.column_config` entries; metrics and sentences use `count`, `usd`, `seconds` and
charts.fmt_ms. A price that is not set reads "set a price (docs/cost.md)", never None.
"""

from __future__ import annotations

from typing import Any, Final

import streamlit as st

#: What a cost figure reads when no price is set.
NO_PRICE: Final = "set a price (docs/cost.md)"
#: The same in a metric, whose value a narrow column would cut short (its help gives NO_PRICE).
NO_PRICE_SHORT: Final = "set a price"


def count(x: float | None) -> str:
    """A count with thousands separators (– when unknown)."""
    return "–" if x is None or x != x else f"{x:,.0f}"


def usd(x: float | None, per: str = "") -> str:
    """A dollar amount, or the sentence that asks for a price."""
    return NO_PRICE if x is None or x != x else f"${x:,.2f}{per}"


def usd_metric(x: float | None, per: str = "") -> tuple[str, str | None]:
    """A dollar amount for `st.metric`: (value, help); with no price, the short sentence and NO_PRICE as help."""
    return (NO_PRICE_SHORT, NO_PRICE) if x is None or x != x else (usd(x, per), None)


def seconds(x: float | None) -> str:
    """Seconds with one decimal and separators."""
    return "–" if x is None or x != x else f"{x:,.1f} s"


def ms(label: str) -> Any:
    """A milliseconds column: whole ms with separators."""
    return st.column_config.NumberColumn(label, format="%,.0f ms")


def number(label: str, fmt: str = "%,.0f") -> Any:
    """A numeric column with separators."""
    return st.column_config.NumberColumn(label, format=fmt)


def percent(label: str) -> Any:
    """A share as a percentage."""
    return st.column_config.NumberColumn(label, format="percent")


def utc(label: str) -> Any:
    """A UTC date-time column (24-hour)."""
    return st.column_config.DatetimeColumn(label, format="YYYY-MM-DD HH:mm:ss", timezone="UTC")


def exemplar_columns() -> dict[str, Any]:
    """Column headers and formats of an exemplar table (analysis.traces.slowest rows)."""
    return {
        "trace": st.column_config.LinkColumn("trace (opens the waterfall)", display_text=r"trace=([0-9a-f]{12})",
                                             width="medium"),
        "trace_id": st.column_config.TextColumn("trace id"),
        "start": utc("start (UTC)"),
        "latency_ms": ms("latency"),
        "input_tokens": number("input tokens"),
        "output_tokens": number("output tokens"),
    }
