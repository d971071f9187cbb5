"""Deep links: the spike window, the filters and the trace of a view live in its URL (st.query_params).

A reload shows the same view, and a link pasted in an incident channel opens it: `?start_ns=&end_ns=`
(the Spike page's window), `?trace=` (the Traces page's trace), `?service=&model=&replica=&tenant=`
(the sidebar's filters, repeated for several values), `?attr=&attr_value=` (one attribute filter: the
key, and its values repeated), `?attr.<key>=` (each of several attribute filters: its values repeated; a
request meets all of them) and `?since_ns=&until_ns=` (its time range). `value_url` links a value the report
names (a built-in dimension's or an attribute's) to the Overview filtered to it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import streamlit as st

from analysis.attribute_filters import AttributeFilter

if TYPE_CHECKING:
    import pandas as pd

    from dashboard.data import Filters

#: URL keys of the sidebar's time range.
SINCE, UNTIL = "since_ns", "until_ns"
#: URL keys of the sidebar's attribute filter: the key, and its values (repeated).
ATTR, ATTR_VALUE = "attr", "attr_value"
#: URL key prefix of one of several attribute filters: `attr.<key>`, its values repeated.
ATTR_PREFIX = "attr."
#: The Overview's link path: the app's default page, at its root (relative, so a base URL path is kept).
OVERVIEW = "./"


def _int(value: object) -> int | None:
    return int(value) if isinstance(value, str) and value.isdigit() else None


def window() -> tuple[int, int] | None:
    """The window (start_ns, end_ns) the URL names, or None."""
    a, b = _int(st.query_params.get("start_ns")), _int(st.query_params.get("end_ns"))
    return (a, b) if a is not None and b is not None and b > a else None


def brushed(ms: Sequence[float]) -> tuple[int, int]:
    """A window brushed on a chart (its x interval: ms since the epoch, as the browser's floats) as (start_ns,
    end_ns) in whole seconds, the charts' resolution (every window is whole seconds): the link then reads
    ...921000000000, not ...921040999936, and a reload explains the same requests. At least one second long."""
    a, b = sorted(round(float(x) / 1_000) for x in ms[:2])
    return a * 1_000_000_000, max(b, a + 1) * 1_000_000_000


def new_window() -> tuple[int, int] | None:
    """The URL's window when it changed since this session last saw it (a link followed), else None."""
    value = window()
    if value is None or value == st.session_state.get("_seen_window"):
        return None
    st.session_state["_seen_window"] = value
    return value


def set_window(start_ns: int, end_ns: int) -> None:
    """Put the shown window in the URL (a reload or a shared link opens it)."""
    st.session_state["_seen_window"] = (start_ns, end_ns)
    if window() != (start_ns, end_ns):
        st.query_params["start_ns"], st.query_params["end_ns"] = str(start_ns), str(end_ns)


def trace() -> str | None:
    """The trace id the URL names, or None."""
    value = st.query_params.get("trace")
    return str(value) if value else None


def new_trace() -> str | None:
    """The URL's trace when it changed since this session last saw it (a link followed), else None."""
    value = trace()
    if value is None or value == st.session_state.get("_seen_trace"):
        return None
    st.session_state["_seen_trace"] = value
    return value


def set_trace(trace_id: str) -> None:
    """Put the shown trace in the URL."""
    st.session_state["_seen_trace"] = trace_id
    if trace() != trace_id:
        st.query_params["trace"] = trace_id


def filter_params(f: Filters, dims: Sequence[str]) -> dict[str, list[str]]:
    """The URL parameters of filters `f` (only those set)."""
    out: dict[str, list[str]] = {d: list(getattr(f, d)) for d in dims if getattr(f, d)}
    kept = [a for a in f.attributes if a.values]
    if len(kept) == 1:  # the one-filter form, as `tailscope watch` writes it
        out[ATTR], out[ATTR_VALUE] = [kept[0].key], list(kept[0].values)
    for a in kept if len(kept) > 1 else []:
        out[ATTR_PREFIX + a.key] = list(a.values)
    if f.since_ns is not None:
        out[SINCE] = [str(f.since_ns)]
    if f.until_ns is not None:
        out[UNTIL] = [str(f.until_ns)]
    return out


def seed_filters(dims: Sequence[str], options: Mapping[str, Sequence[str]]) -> tuple[int | None, int | None]:
    """On a session's first run, set the sidebar's widgets from the URL's filters (values the store holds);
    returns the URL's time range (ns) for the slider's initial value."""
    if st.session_state.get("_links_seeded"):
        return None, None
    st.session_state["_links_seeded"] = True
    for d in dims:
        wanted = [v for v in st.query_params.get_all(d) if v in options.get(d, ())]
        if wanted:
            st.session_state[f"f_{d}"] = wanted
    return _int(st.query_params.get(SINCE)), _int(st.query_params.get(UNTIL))


def linked_attributes() -> dict[str, list[str]]:
    """The attribute filters the URL names, key -> values (both forms: `?attr=&attr_value=`, `?attr.<key>=`)."""
    out: dict[str, list[str]] = {}
    key = st.query_params.get(ATTR)
    if key:
        out[str(key)] = list(st.query_params.get_all(ATTR_VALUE))
    for name in st.query_params:
        if name.startswith(ATTR_PREFIX) and len(name) > len(ATTR_PREFIX):
            out.setdefault(name[len(ATTR_PREFIX):], []).extend(st.query_params.get_all(name))
    return out


def linked_attribute() -> bool:
    """Whether the URL names an attribute filter the session has not applied yet (a link followed)."""
    return not st.session_state.get("_links_attr_seeded") and bool(linked_attributes())


def seed_attribute(choices: Mapping[str, Mapping[str, Any]]) -> None:
    """On a session's first run, set the sidebar's attribute filters from the URL's (keys and values the store
    holds)."""
    if st.session_state.get("_links_attr_seeded"):
        return
    st.session_state["_links_attr_seeded"] = True
    keys = []
    for key, values in linked_attributes().items():
        wanted = [v for v in values if key in choices and v in choices[key]["values"]]
        if wanted:
            keys.append(key)
            st.session_state[f"f_attr_values:{key}"] = wanted
    if keys:
        st.session_state["f_attrs"] = keys


def publish_filters(f: Filters, dims: Sequence[str]) -> None:
    """Write the sidebar's filters into the URL, leaving the page's own keys (window, trace) alone."""
    wanted = filter_params(f, dims)
    held = [k for k in st.query_params if k.startswith(ATTR_PREFIX)]
    for key in dict.fromkeys((*dims, ATTR, ATTR_VALUE, SINCE, UNTIL, *held, *wanted)):
        have = st.query_params.get_all(key)
        if have != wanted.get(key, []):
            if key in wanted:
                st.query_params[key] = wanted[key]
            else:
                del st.query_params[key]


def url(page: str, f: Filters, dims: Sequence[str], **extra: Any) -> str:
    """A link to `page` (its URL path: spike, traces, …) showing filters `f` and `extra` (start_ns, trace, …)."""
    query = urlencode({**filter_params(f, dims), **{k: [str(v)] for k, v in extra.items() if v is not None}},
                      doseq=True)
    return f"{page}?{query}" if query else page


def narrowed_to(f: Filters, conditions: Sequence[Mapping[str, Any]], dims: Sequence[str]) -> Filters | None:
    """Filters `f` narrowed to each condition's value (the report's form: dimension, value, attribute, source, and
    lo / hi for a bucket): a built-in filter dimension's value, or an attribute filter on its key (replacing one on
    the same key). None when a condition has no filter (a built-in the sidebar does not filter: a token bucket)."""
    built: dict[str, Any] = {}
    attrs = {a.key: a for a in f.attributes}
    for c in conditions:
        key = c.get("attribute")
        if key:
            lo, hi = c.get("lo"), c.get("hi")
            attrs[key] = AttributeFilter(key, c["source"], (c["value"],),
                                         ((int(lo), int(hi)),) if lo is not None and hi is not None else ())
        elif c["dimension"] in dims:
            built[c["dimension"]] = (c["value"],)
        else:
            return None
    return dataclasses.replace(f, attributes=tuple(attrs.values()), **built)


def value_url(f: Filters, conditions: Sequence[Mapping[str, Any]], dims: Sequence[str],
              page: str = OVERVIEW) -> str | None:
    """A link to `page` (the Overview) showing filters `f` narrowed to `conditions` (`narrowed_to`), or None."""
    narrowed = narrowed_to(f, conditions, dims)
    return None if narrowed is None else url(page, narrowed, dims)


def exemplar_table(rows: pd.DataFrame, f: Filters) -> None:
    """Exemplar rows (analysis.traces.slowest) with the columns an on-call reads, each trace id a link that
    opens its waterfall on the Traces page (with the same filters `f`): a static table (formats.table: a spike's few
    exemplars, the Traces page's slowest)."""
    from dashboard import data, formats

    shown = rows.assign(trace=[url("traces", f, data.FILTER_DIMENSIONS, trace=t) for t in rows["trace_id"]])
    cols = [c for c in ("trace", "start", "replica", "model", "tenant", "status", "latency_ms", "input_tokens",
                        "output_tokens") if c in shown.columns]
    formats.table(shown[cols], formats.exemplar_columns())
