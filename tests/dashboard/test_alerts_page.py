"""The Alerts page, alert markers on the Overview, and the Spike page opened from an alert's link."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from analysis.engine.connect import connect
from analysis.engine.percentiles import parse_time
from analysis.watch import AlertStore, Config, alerts_frame, replay
from tests.dashboard.conftest import APP
from tests.dashboard.incident_store import Incident
from tests.sql import one


@pytest.fixture(scope="module")
def alerted(incident: tuple[Path, Incident], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    """A copy of the incident store holding the alerts a watch replay over it fires, kept as a live watch does."""
    src, _ = incident
    store = tmp_path_factory.mktemp("alerted") / "store"
    shutil.copytree(src, store)
    assert alerts_frame(store).height == 0  # nothing kept yet
    con = connect(store)
    lo, hi = one(con, "SELECT min(start_ns), max(start_ns) FROM requests")
    con.close()
    fired = replay(store, Config(), int(lo), int(hi) + 1)
    assert fired and parse_time(fired[0]["window_start"]) is not None
    for alert in fired:
        AlertStore(store).save_alert(alert)
    return store, fired


def _app(store: Path, monkeypatch: pytest.MonkeyPatch, page: str, **query: int) -> AppTest:
    monkeypatch.setenv("TAILSCOPE_STORE", str(store))
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.run()
    at.switch_page(page)
    for k, v in query.items():
        at.query_params[k] = str(v)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def test_the_alerts_page_lists_what_watch_kept(alerted: tuple[Path, list[dict]],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    store, fired = alerted
    at = _app(store, monkeypatch, "app_pages/alerts.py")
    assert [m.value for m in at.metric if m.label == "alerts"] == [f"{len(fired):,}"]
    table = at.dataframe[0].value
    assert list(table["id"]) == [a["id"] for a in sorted(fired, key=lambda a: a["fired_at"], reverse=True)]
    newest = sorted(fired, key=lambda a: a["fired_at"], reverse=True)[0]
    end = parse_time(newest["window_end"])
    assert table.iloc[0]["window"] == f"spike?start_ns={newest['window_start_ns']}&end_ns={end}"


def test_the_overview_marks_alerts(alerted: tuple[Path, list[dict]], monkeypatch: pytest.MonkeyPatch) -> None:
    store, fired = alerted
    at = _app(store, monkeypatch, "app_pages/overview.py")
    assert any(f"{len(fired)} alert(s)" in c.value for c in at.caption)


def test_the_spike_page_opens_the_linked_window(alerted: tuple[Path, list[dict]],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    store, fired = alerted
    a = fired[0]
    start, end = a["window_start_ns"], parse_time(a["window_end"])
    at = _app(store, monkeypatch, "app_pages/spike.py", start_ns=start, end_ns=int(end or 0))
    assert str(at.radio(key="spike_choice").value).startswith("linked ")
    assert [m.value for m in at.metric if m.label == "requests in window"]


def test_the_alerts_page_on_a_store_without_alerts(empty_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(empty_store, monkeypatch, "app_pages/alerts.py")
    assert at.info and not at.error


def test_a_link_with_a_rules_filter_opens_with_that_filter(alerted: tuple[Path, list[dict]],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """An SLO rule's link carries its filter (`&replica=...`): a new session starts with it picked in the sidebar."""
    store, _ = alerted
    con = connect(store)
    replica = con.execute("SELECT min(replica) FROM requests").fetchall()[0][0]
    con.close()
    monkeypatch.setenv("TAILSCOPE_STORE", str(store))
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.query_params["replica"] = replica
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert at.multiselect(key="f_replica").value == [replica]
