"""How numbers read on every page: column headers in words, units, thousands separators, no None or nan.

Tables use these `st.column_config` entries; metrics and sentences use `count`, `usd`, `seconds` and
charts.fmt_ms. A price that is not set reads "set a price (docs/cost.md)", never None.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import streamlit as st

if TYPE_CHECKING:
    import pandas as pd

#: What a cost figure reads when no price is set.
NO_PRICE: Final = "set a price (docs/cost.md)"


def count(x: float | None) -> str:
    """A count with thousands separators (– when unknown)."""
    return "–" if x is None or x != x else f"{x:,.0f}"


def usd(x: float | None, per: str = "") -> str:
    """A dollar amount, or the sentence that asks for a price."""
    return NO_PRICE if x is None or x != x else f"${x:,.2f}{per}"


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


#: ASCII punctuation: each is escaped in a static table's text cells, which are Markdown (CommonMark
#: allows a backslash before any of them, so nothing else changes).
_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")


def _missing(x: Any) -> bool:
    """None, NaN, NaT or pandas' NA (whose comparison cannot be a bool)."""
    try:
        return x is None or bool(x != x)
    except TypeError:
        return True


def literal(x: Any) -> str:
    """A text cell of a static table shown as it is: Markdown's punctuation escaped (– when missing)."""
    return "–" if _missing(x) else _PUNCTUATION.sub(r"\\\1", str(x))


def ms_text(x: float | None) -> str:
    """Whole milliseconds with separators, as the tables' `ms` columns read (– when unknown)."""
    return "–" if _missing(x) else f"{x:,.0f} ms"


def share(x: float | None) -> str:
    """A share as a percentage with one decimal (– when unknown)."""
    return "–" if _missing(x) else f"{x:.1%}"


def utc_text(x: Any) -> str:
    """A UTC date-time, 24-hour, as the tables' `utc` columns read (– when missing)."""
    import pandas as pd

    if _missing(x):
        return "–"
    t = pd.Timestamp(x)
    return f"{t if t.tzinfo is None else t.tz_convert('UTC'):%Y-%m-%d %H:%M:%S}"


def link(text: str | Callable[[str], str]) -> Callable[[Any], str]:
    """How a link cell reads: its URL shown as `text` (or as `text(url)`); "" when there is none."""
    def cell(url: Any) -> str:
        if not isinstance(url, str) or not url:
            return ""
        return f"[{literal(text if isinstance(text, str) else text(url))}]({url})"
    return cell


#: A cell that reads as a number (a count, ms, a share, a score; – when unknown): its column is right-aligned.
_NUMERIC = re.compile(r"^(–|-?[\d,]+(\.\d+)?( ms|%)?)$")


def markdown_table(rows: pd.DataFrame, columns: Mapping[str, tuple[str, Callable[[Any], str]]]) -> str:
    """`rows` as a GitHub-flavoured Markdown table: each column of `columns` (-> its header, how a value reads),
    its cells formatted (a text cell through `literal`, so no `|` ends a cell early), a column whose every cell
    reads as a number right-aligned."""
    cells = [[fmt(row[c]) for c, (_, fmt) in columns.items()] for _, row in rows.iterrows()]
    right = [bool(cells) and all(_NUMERIC.match(r[i]) for r in cells) for i in range(len(columns))]
    lines = ["| " + " | ".join(literal(header) for header, _ in columns.values()) + " |",
             "|" + "|".join("---:" if r else "---" for r in right) + "|"]
    lines += ["| " + " | ".join(c or " " for c in row) + " |" for row in cells]
    return "\n".join(lines)


def static_table(rows: pd.DataFrame, columns: Mapping[str, tuple[str, Callable[[Any], str]]]) -> None:
    """A small table (a score of rows) drawn as a Markdown table (`markdown_table`), not the interactive grid: no
    grid or table script to load (Streamlit's Markdown renderer is already loaded) and no canvas, which was most of
    a page's first render when its tables are short, and of a first click to it."""
    st.markdown(markdown_table(rows, columns))


def _trace_prefix(url: str) -> str:
    """The first 12 hex digits of the trace a Traces link names (the grid's link text too)."""
    found = re.search(r"trace=([0-9a-f]{12})", url)
    return found.group(1) if found else url


#: An exemplar table's columns drawn as a static table (`static_table`): the same headers and formats as
#: `exemplar_columns`' grid.
EXEMPLAR_CELLS: Final[dict[str, tuple[str, Callable[[Any], str]]]] = {
    "trace": ("trace (opens the waterfall)", link(_trace_prefix)),
    "start": ("start (UTC)", utc_text), "replica": ("replica", literal), "model": ("model", literal),
    "tenant": ("tenant", literal), "status": ("status", literal), "latency_ms": ("latency", ms_text),
    "input_tokens": ("input tokens", count), "output_tokens": ("output tokens", count)}
