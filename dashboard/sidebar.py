"""The sidebar every page shares: filters (time range, service, model, replica, tenant) and live mode.

`render()` runs from the router before the page, so the widgets (and their values) survive
page switches; pages read the result with `current()`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import streamlit as st

from analysis.engine.store_status import store_status, summary_line
from dashboard import data, formats, links

_KEY = "tailscope_filters"
LIVE_INTERVALS_S: tuple[int, ...] = (5, 15, 60)


def _dt(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).replace(tzinfo=None)


def _ns(dt: datetime) -> int:
    return int(dt.replace(tzinfo=UTC).timestamp() * 1_000_000) * 1000


def render(db: data.Bench) -> data.Filters:
    """Draw the filters and live controls; store and return the filters they describe."""
    with st.sidebar:
        _live_controls(db)
        c = data.choices(db, str(db.store), db.version)
        if not c["requests"]:
            st.caption(f"No requests in the store yet: {data.no_request_hint(db.store)}.")
            filters = data.Filters()
            st.session_state[_KEY] = filters
            return filters
        # the widgets sit in a popover, which the browser draws only once opened (a closed one mounts none of its
        # elements): the selects and the slider are the costliest part of a page's first render, and most visits
        # change no filter; the line under it says which filters hold, and the URL carries them
        with st.popover("Filters", icon=":material/filter_list:", width="stretch",
                        help="time range, service, model, replica, tenant, attributes"):
            filters = _filter_controls(db, c)
        st.caption(summary_text(filters))
        st.session_state[_KEY] = filters
        links.publish_filters(filters, data.FILTER_DIMENSIONS)
        return filters


def _filter_controls(db: data.Bench, c: dict[str, Any]) -> data.Filters:
    """The time range, each dimension's values and the attribute filters (`c`: data.choices'), as widgets."""
    lo, hi = _dt(c["min_ns"]), _dt(c["max_ns"]) + timedelta(seconds=1)
    lo = lo.replace(second=0, microsecond=0)
    since_ns = until_ns = None
    a_ns, b_ns = links.seed_filters(data.FILTER_DIMENSIONS, c)  # a shared link's filters, on a first run
    if hi - lo > timedelta(minutes=1):
        start = min(max(_dt(a_ns), lo), hi) if a_ns is not None else lo
        picked = st.slider("Time range (UTC)", min_value=lo, max_value=hi,
                           value=(start, max(min(_dt(b_ns), hi), start) if b_ns is not None else hi),
                           step=timedelta(minutes=1), format="MM-DD HH:mm", key="f_time")
        a, b = picked
        if a > lo:
            since_ns = _ns(a)
        if b < hi:
            until_ns = _ns(b)
    picks: dict[str, tuple[str, ...]] = {}
    for dim in data.FILTER_DIMENSIONS:
        options = c[dim]
        if len(options) > 1 or st.session_state.get(f"f_{dim}"):
            chosen = st.multiselect(dim.capitalize(), options, key=f"f_{dim}", placeholder=f"all {dim}s")
        else:
            chosen = []
        picks[dim] = tuple(sorted(chosen))
    return data.Filters(since_ns, until_ns, **picks, attributes=_attribute_control(db))


def summary_text(f: data.Filters) -> str:
    """The filters `f` on one line, as the sidebar shows them under its closed popover: the time range (UTC), then
    each filtered dimension's and attribute's values; "All requests" when none is set. Markdown-escaped."""
    a, b = (None if ns is None else f"{_dt(ns):%m-%d %H:%M}" for ns in (f.since_ns, f.until_ns))
    parts = [f"{a}–{b} UTC" if a and b else f"from {a} UTC" if a else f"until {b} UTC"] if a or b else []
    parts += [f"{dim} = {', '.join(getattr(f, dim))}" for dim in data.FILTER_DIMENSIONS if getattr(f, dim)]
    parts += [f"{a.key} = {', '.join(a.values)}" for a in f.attributes if a.values]
    text = " · ".join(parts) if parts else "All requests"
    return formats.escape(text)


def _attribute_control(db: data.Bench) -> tuple[data.AttributeFilter, ...]:
    """Any attributes the report considers (analysis lists them), then each one's values: a request meets every
    attribute picked (one of its values each); () when none is picked."""
    if not db.can("attribute_filters"):
        st.caption(f"Attribute filters: {db.missing('attribute_filters')}.")
        return ()
    if not db.can("attribute_listing"):  # listing costs the report's attribute pass: off until asked for
        if links.linked_attribute():  # a shared link's attribute filter turns the control on, on a first run
            st.session_state["f_attr_on"] = True
        if not st.toggle("Filter by attribute", key="f_attr_on",
                         help=f"any attribute the report considers ({db.missing('attribute_listing')})"):
            return ()
    choices = data.attribute_choices(db, str(db.store), db.version)
    if not choices:
        st.caption("No attribute of these requests is a dimension the report considers.")
        return ()
    links.seed_attribute(choices)
    keys = st.multiselect("Attributes", list(choices), key="f_attrs", placeholder="any attribute",
                          help="a request must match every attribute picked, and one of the values picked for each")
    out = []
    for key in keys:
        if key not in choices:
            continue
        picked = st.multiselect(f"{key} =", choices[key]["values"], key=f"f_attr_values:{key}",
                                placeholder="all values")
        if picked:
            out.append(data.attribute_filter(choices, key, tuple(sorted(picked))))
    return tuple(out)


def _live_controls(db: data.Bench) -> None:
    """Refresh now, or every N seconds while the store grows (no lock: segments are immutable files)."""
    cols = st.columns([1, 1])
    if cols[0].button("Refresh", key="refresh", help="Read segments written since the last refresh"):
        _refresh(db)
    st.session_state["_seen_version"] = db.version
    live = cols[1].toggle("Live", key="live", help="Refresh on an interval while `tailscope collect` writes")
    if live:
        every = st.select_slider("every (s)", LIVE_INTERVALS_S, value=LIVE_INTERVALS_S[0], key="live_every")

        @st.fragment(run_every=every)
        def _tick() -> None:
            db.refresh()
            if st.session_state.get("_seen_version") != db.version:
                st.rerun(scope="app")

        _tick()
    refreshed = datetime.fromtimestamp(db.last_refresh_s, tz=UTC)
    st.caption(formats.escape(f"{db.store} · data v{db.version} · refreshed {refreshed:%H:%M:%S} UTC"))
    if db.can("segments"):  # how the store is (segments, compaction lag, retention): the listing only
        st.caption(summary_line(store_status(db.store, footers=False)))
    note = db.loading_note()
    if note:
        st.caption(f":material/hourglass_top: {note}")


def _refresh(db: data.Bench, quiet: bool = False) -> bool:
    changed = db.refresh()
    if not quiet:
        st.toast("New data loaded." if changed else "No new segments.")
    return changed


def current() -> data.Filters:
    """The filters the sidebar set on this run."""
    value = st.session_state.get(_KEY)
    return value if isinstance(value, data.Filters) else data.Filters()


def replay_page(title: str) -> tuple[data.Bench, data.Filters, tuple[data.Bench, str, int]]:
    """The head of a page that replays the queue (What-if, Capacity): title, and a stop with a note when it cannot.

    Returns (workbench, filters, the data-call key). Whether any request matches is read from the filtered count
    (`data.detection`, a min/max/count query), not from a per-replica breakdown (its quantiles: 0.4 CPU-s at 1.4 M
    requests) that the Capacity page would not show.
    """
    db = data.open_store()
    f = current()
    key = (db, str(db.store), db.version)
    st.title(title)
    if not data.detection(*key, f)["requests"]:
        st.info("No requests match the filters: nothing to replay.")
        st.stop()
    if db.pending:
        st.info("The replay needs each request's queue wait (a critical-path column), which is still being "
                "computed for this store. " + (db.loading_note() or ""))
        st.stop()
    return db, f, key
