"""The dashboard's report under dimension filters, read in place, equals the report over a copy of the kept requests.

With a dimension filter (service, model, replica, tenant) and at most data.LIVE_HOURS_IN_PLACE stale hours, the
workbench's report reads the store's own request facts with analysis.report's `only` (the materialized hours scanned
with the predicate, the live hours' facts from the workbench's rows) instead of copying the filtered requests. The
answer must be the one analysis gives on its own connection over a `source` query holding just the kept requests
(their live hours computed from the spans), and the one of the workbench's copy as read before; the spike marks,
find_spikes' over that source; an explained (brushed) window, explain_window's.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from analysis.engine.connect import connect
from analysis.report import build_report, explain_window, find_spikes
from dashboard import data
from tests.dashboard.incident_store import (
    MODELS,
    REPLICAS,
    SLOW_REPLICA,
    START_NS,
    TENANTS,
    Incident,
    leave_live,
    write_incident_store,
)

SEC = 1_000_000_000


def _store(tmp_path: Path, seed: int, requests: int = 16_000) -> Path:
    """Four hours of requests (replica-05 slow in the third), a random set of hours materialized and at most two
    left live (none, some seeds)."""
    store = tmp_path / "store"
    write_incident_store(store, requests=requests, duration_s=3.5 * 3600, seed=seed,
                         incident=Incident(2.2 * 3600, 2.6 * 3600))
    leave_live(store, seed, 0, data.LIVE_HOURS_IN_PLACE)
    return store


def _filters(rng: random.Random) -> list[data.Filters]:
    """Two random dimension filters: the slow replica and three others (its spike kept), then one of three others (a
    model; two tenants and a model; five replicas and the service over a time range)."""
    others = [r for r in REPLICAS if r != SLOW_REPLICA]
    return [
        data.Filters(replica=tuple(sorted([SLOW_REPLICA, *rng.sample(others, 3)]))),
        rng.choice([
            data.Filters(model=(rng.choice(MODELS),)),
            data.Filters(tenant=tuple(sorted(rng.sample(TENANTS, 2))), model=(rng.choice(MODELS),)),
            data.Filters(START_NS + 1800 * SEC, START_NS + 3 * 3600 * SEC,
                         replica=tuple(sorted(rng.sample(REPLICAS, 5))), service=("llm-server",)),
        ]),
    ]


def _kept(f: data.Filters) -> str:
    """A query of exactly the requests `f`'s dimension values keep (the reference's `source`)."""
    conds = [f"{d} IN ({', '.join(repr(v) for v in getattr(f, d))})" for d in data.FILTER_DIMENSIONS
             if getattr(f, d)]
    return f"(SELECT * FROM requests WHERE {' AND '.join(conds)})"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_filtered_reports_read_in_place_equal_a_copy(tmp_path: Path, seed: int) -> None:
    store = _store(tmp_path, seed)
    wb = data.Workbench(store)
    wb.refresh()
    key = (wb, str(wb.store), wb.version)
    cli = connect(store)  # analysis on its own: the live hours computed from their spans
    spiked = 0
    for f in _filters(random.Random(seed)):
        assert data._report_source(wb, f) is None and data._report_only(f, None)
        win = data.detection(*key, f)["judged_window_s"]
        ask = {"window_s": win, "since": f.since_ns, "until": f.until_ns, "include_failures": True}
        report = data._report_of(wb, str(store), wb.version, f, "e2e")
        assert report == build_report(cli, source=_kept(f), **ask)
        with data._cursor(wb, f) as cur:  # the copy of the workbench's filtered rows, as read before
            assert report == build_report(cur, source="requests", **ask)
        marks = find_spikes(cli, source=_kept(f), **ask)
        assert data._spike_marks(wb, str(store), wb.version, f, "e2e") == {
            **marks, "spikes": sorted(marks["spikes"], key=lambda s: s["start"])}
        a, b = START_NS + 2 * 3600 * SEC, START_NS + 2 * 3600 * SEC + 1200 * SEC  # a window no spike is exactly
        assert wb.explain_window(f, a, b, "e2e", win) == explain_window(cli, a, b, source=_kept(f), **ask)
        spiked += bool(report["spikes"])
    assert spiked  # at least one filter keeps the slow replica's spike (its explanation compared too)
    cli.close()


def test_only_keeps_exactly_the_values(tmp_path: Path) -> None:
    """`only` with no values keeps every request; an unknown dimension is refused with a one-line error."""
    from tracing.errors import QueryError

    store = _store(tmp_path, 4, 4_000)
    con = connect(store)
    assert build_report(con, only={"model": ()}) == build_report(con)
    with pytest.raises(QueryError, match="cannot filter the report by colour"):
        build_report(con, only={"colour": ("red",)})
    con.close()
