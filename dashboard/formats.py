"""How numbers read on every page: column headers in words, units, thousands separators, no None or nan.

Tables use these `st.column_config` entries; metrics and sentences use `count`, `usd`, `seconds` and
charts.fmt_ms. A price that is not set reads "set a price (docs/cost.md)", never None.

A small table (a few dozen rows at most, nothing to sort or pick) is drawn by `table` as one Markdown table with
the same column entries, not as the interactive grid (`st.dataframe`): the grid's script (about 1.2 MB to fetch
and compile) and its canvas are the largest cost of a first render in a new browser profile, and `st.table`, which
renders each cell as its own Markdown, costs the browser more still once a table has a few dozen cells
(docs/benchmarks.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import streamlit as st

from dashboard.charts import window_label

if TYPE_CHECKING:
    import pandas as pd

#: What a cost figure reads when no price is set.
NO_PRICE: Final = "set a price (docs/cost.md)"
#: The same in a metric, whose value a narrow column would cut short (its help gives NO_PRICE).
NO_PRICE_SHORT: Final = "set a price"


def count(x: float | None) -> str:
    """A count with thousands separators (– when unknown)."""
    return "–" if x is None or x != x else f"{x:,.0f}"


def counted(n: int, noun: str) -> str:
    """`n noun` with the noun's plural (an s) unless n is 1: "1 replica", "32 replicas"."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def usd(x: float | None, per: str = "") -> str:
    """A dollar amount, or the sentence that asks for a price."""
    return NO_PRICE if x is None or x != x else f"${x:,.2f}{per}"


def usd_metric(x: float | None, per: str = "") -> tuple[str, str | None]:
    """A dollar amount for `st.metric`: (value, help); with no price, the short sentence and NO_PRICE as help."""
    return (NO_PRICE_SHORT, NO_PRICE) if x is None or x != x else (usd(x, per), None)


def metric_row() -> Any:
    """A row for a page's metrics (`row.metric(...)`, in order): one horizontal container that wraps them onto a
    second line where the page is too narrow for all (in columns, at 1,024 px, "14,448" read "14,…")."""
    return st.container(horizontal=True, gap="medium")


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


#: The characters Markdown (with Streamlit's `:directive[...]`, `:emoji:` and `$math$`) could read as formatting
#: inside a line of text or a Markdown table's cell (no list or heading marker matters there; `|` ends a cell).
_MARKDOWN = re.compile(r"[\\`*_{}\[\]<>~$:|#]")
#: A colon between two digits (a clock time's): `14:06:00` holds `:06:`, which Streamlit's Markdown takes for an
#: emoji shortcode and so loads its emoji plugin (about 260 KB of script) to look it up.
_CLOCK_COLON = re.compile(r"(?<=\d):(?=\d)")
#: A grid number format (printf-like, as st.column_config takes it): prefix, thousands flag, precision, kind, suffix.
_PRINTF = re.compile(r"^(?P<pre>[^%]*)%(?P<comma>,?)(?P<prec>\.\d+)?(?P<kind>[dfe])(?P<post>.*)$")
#: A grid date-time format's tokens (moment.js style) -> strftime's.
_MOMENT = (("YYYY", "%Y"), ("MM", "%m"), ("DD", "%d"), ("HH", "%H"), ("mm", "%M"), ("ss", "%S"))
#: What an unknown cell reads in a static table.
MISSING: Final = "–"
#: The most rows `table` draws statically; a longer table is the grid, which scrolls, sorts and draws only the rows
#: in view.
STATIC_ROWS: Final = 40


def escape(text: str) -> str:
    """`text` with Markdown's punctuation escaped, to show as it is (a line of text, a static table's cell)."""
    return _MARKDOWN.sub(r"\\\g<0>", text)


def times(markdown: str) -> str:
    """`markdown` with each clock time's colons escaped (it reads the same): a time is then not taken for an emoji
    shortcode, and the page does not load the emoji plugin for it."""
    return _CLOCK_COLON.sub(r"\\:", markdown)


def not_judged(reason: str, context: list[tuple[int, int]], then: str = "") -> str:
    """The banner of filters too narrow for spike detection to judge (Overview and Spike page): no all clear, and
    the unfiltered range's spikes (`context`, shaded grey on the charts) named; `then`: what to do next."""
    named = (f" Without the filters, this range has {len(context)} spike(s), shaded grey: "
             + ", ".join(window_label(a, b) for a, b in context) + "." + then) if context else ""
    return times(f"**Spike detection could not judge these filters**: {reason}. No spike is *not* an all clear "
                 f"here.{named}")


def _missing(x: Any) -> bool:
    """Whether a cell is unknown: None, NaN, NaT or pandas' NA."""
    import pandas as pd

    try:
        return x is None or bool(pd.isna(x) is True)
    except (TypeError, ValueError):  # a list or an array in a cell: not one unknown value
        return False


def _number(fmt: str | None) -> Callable[[Any], str]:
    """A cell formatter for a grid number format: "%,.0f ms", "$%,.2f", "%,d", "%.2f", "percent" (one decimal)."""
    if fmt == "percent":
        return lambda x: f"{float(x):.1%}"
    m = _PRINTF.match(fmt or "")
    if m is None:  # no format: integers with separators, other numbers to two decimals
        return lambda x: f"{x:,}" if isinstance(x, int) or float(x).is_integer() else f"{float(x):,.2f}"
    spec = f"{m['comma']}{m['prec'] or ('.0' if m['kind'] == 'd' else '')}{'f' if m['kind'] == 'd' else m['kind']}"
    return lambda x: f"{m['pre']}{float(x):{spec}}{m['post']}"


def _cell(config: Mapping[str, Any] | None) -> Callable[[Any], str]:
    """How one column's cell reads in a static table, from its grid column entry (st.column_config): numbers and
    shares in their format, a link as a Markdown link (its display text, or the part the display pattern picks
    out of the URL), a date-time in its format; text escaped; an unknown value MISSING."""
    kind = (config or {}).get("type_config", {})
    shown: Callable[[Any], str]
    if kind.get("type") == "number":
        number = _number(kind.get("format"))
        shown = lambda x: escape(number(x))  # noqa: E731
    elif kind.get("type") == "progress":
        shown = lambda x: escape(f"{float(x):.0%}")  # noqa: E731
    elif kind.get("type") == "link":
        text = kind.get("display_text")

        def shown(x: Any) -> str:
            found = re.search(text, str(x)) if text and "(" in text else None
            label = found.group(1) if found else (text or str(x))
            return f"[{escape(label)}]({str(x).replace(' ', '%20').replace(')', '%29')})"
    elif kind.get("type") == "datetime":
        fmt, zone = kind.get("format") or "YYYY-MM-DD HH:mm:ss", kind.get("timezone")
        for moment, strf in _MOMENT:
            fmt = fmt.replace(moment, strf)

        def shown(x: Any) -> str:
            return escape((x.tz_convert(zone) if zone and getattr(x, "tzinfo", None) else x).strftime(fmt))
    else:
        def shown(x: Any) -> str:
            if isinstance(x, bool | np.bool_):  # a flag (the grid draws a checkbox)
                return "yes" if x else ""
            return escape(_number(None)(x) if isinstance(x, int | float | np.number) else str(x))
    return lambda x: MISSING if _missing(x) else shown(x)


def table(df: pd.DataFrame, column_config: Mapping[str, Any] | None = None, notes: bool = True) -> None:
    """Draw a small table (up to STATIC_ROWS rows) as one Markdown table, without its index: each column headed by
    its entry's label (else its name, underscores as spaces), its cells read as `_cell` says, numbers right-aligned.
    With `notes`, a caption under it gives the entries' help texts (a grid shows them on its headers). A longer
    table is the grid (st.dataframe), with the same entries."""
    config = dict(column_config or {})
    if len(df) > STATIC_ROWS:
        st.dataframe(df, hide_index=True, column_config=config)
        return
    labels = {c: str((config.get(c) or {}).get("label") or c).replace("_", " ") for c in df.columns}
    right = [(config.get(c) or {}).get("type_config", {}).get("type") in ("number", "progress")
             or (df[c].dtype.kind in "iuf" and (config.get(c) or {}).get("type_config", {}).get("type") is None)
             for c in df.columns]
    lines = ["| " + " | ".join(escape(labels[c]) for c in df.columns) + " |",
             "|" + "|".join("---:" if r else "---" for r in right) + "|"]
    cells = [[_cell(config.get(c))(v).replace("\n", " ") for v in df[c]] for c in df.columns]
    lines += ["| " + " | ".join(row) + " |" for row in zip(*cells, strict=True)]
    st.markdown("\n".join(lines))
    helps = [f"{labels[c]}: {h}" for c in df.columns if (h := (config.get(c) or {}).get("help"))]
    if notes and helps:
        st.caption(" · ".join(helps))
