"""find_spikes: the report's header and spikes without the explanations, equal to build_report's; and marks_of, which
cuts build_report's answer to find_spikes' (so a caller needing both detects once), equal to it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from analysis import build_report, connect
from analysis.contract import Report
from analysis.report import MARK_KEYS, find_spikes, marks_of
from tests import samples_cache
from tests.analysis.test_report import fleet_store
from tests.sql import one

SEC = 1_000_000_000
#: What each spike item of find_spikes holds: the report item's keys before its explanation.
SPIKE_KEYS = {"start", "end", "requests", "p50_ms", "p99_ms", "baseline_p50_ms", "baseline_p99_ms", "excess_ms",
              "p_value", "windows", "requests_weighted", "n_effective"}


def test_marks_of_leaves_out_the_attribute_pass_and_the_explanations_errors() -> None:
    """The report's errors: detection's, then the attribute pass's (one run), then the sampling judgement's, then each
    spike's explanation's; find_spikes gives detection's and the sampling judgement's only."""
    item = {k: 1 for k in MARK_KEYS} | {"stages": [], "dimensions": [], "exemplars": ["t"], "errors": ["s1", "s2"]}
    report: Any = {"version": 1, "errors": ["d", "a1", "a2", "b", "s1", "s2"], "attributes": {"errors": ["a1", "a2"]},
                   "spikes": [item]}
    assert marks_of(report) == {"version": 1, "errors": ["d", "b"], "attributes": None,
                                "spikes": [{k: 1 for k in MARK_KEYS}]}
    assert report["errors"] == ["d", "a1", "a2", "b", "s1", "s2"]  # the report itself is left as it was


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return samples_cache.built("fleet-spiky", fleet_store, tmp_path_factory)


def _same_as_report(found: Report, report: Report) -> None:
    """Every header key equal; each spike the report's item cut to its window and percentiles; the report's
    errors are find_spikes' followed by the explanations' own. `attributes` (what the explanation read of the
    attributes) is null without an explanation."""
    assert found["attributes"] is None
    assert {k: v for k, v in found.items() if k not in ("spikes", "errors", "attributes")} == \
        {k: v for k, v in report.items() if k not in ("spikes", "errors", "attributes")}
    assert len(found["spikes"]) == len(report["spikes"])
    for mine, item in zip(found["spikes"], report["spikes"], strict=True):
        assert set(mine) == SPIKE_KEYS and set(item) > SPIKE_KEYS
        assert mine == {k: v for k, v in item.items() if k in mine}
    assert report["errors"][:len(found["errors"])] == found["errors"]
    assert report["errors"][len(found["errors"]):] == [e for item in report["spikes"] for e in item["errors"]]
    assert marks_of(report) == found


def test_the_spikes_of_the_report(store: Path) -> None:
    con = connect(store)
    report = build_report(con)
    assert report["spikes"], "the fleet store has a spike"
    _same_as_report(find_spikes(con), report)


@pytest.mark.parametrize("kw", [
    {"metric": "ttft"},
    {"window_s": 30},
    {"include_failures": False},
    {"source": "(SELECT * FROM requests WHERE replica <> 'replica-00')"},
    # weighted (the copy keeps ids and dimensions: the sampling judgement reads them) and a declared policy
    {"source": "(SELECT * REPLACE (CASE WHEN hash(trace_id) % 3 = 0 THEN 3.0 ELSE 1.0 END AS adjusted_count) "
               "FROM requests)"},
    {"source": "requests", "sampling_policy": "head"},
])
def test_with_the_reports_options(store: Path, kw: dict[str, Any]) -> None:
    con = connect(store)
    _same_as_report(find_spikes(con, **kw), build_report(con, **kw))


def test_over_a_time_range(store: Path) -> None:
    con = connect(store)
    lo = one(con, "SELECT min(start_ns) FROM requests")[0]
    since, until = lo + 60 * SEC, lo + 40 * 60 * SEC
    _same_as_report(find_spikes(con, since=since, until=until), build_report(con, since=since, until=until))


@pytest.fixture(scope="module")
def quiet_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fleet_store(tmp_path_factory.mktemp("find-spikes-quiet"), spike=False)


@pytest.mark.parametrize(("kw", "spike", "blank"), [
    ({"source": "requests"}, False, True),
    ({"source": "requests", "metric": "ttft"}, False, True),
    # a spike's bounds are its culprit's, which reads the dimensions: they are copied
    ({"source": "requests"}, True, False),
    # a declared policy judges the sampling, which reads the ids: they are copied
    ({"source": "requests", "sampling_policy": "head"}, False, False),
    # weighted in range: the sampling judgement reads ids and dimensions
    ({"source": "(SELECT * REPLACE (CASE WHEN hash(trace_id) % 3 = 0 THEN 3.0 ELSE 1.0 END AS adjusted_count) "
                "FROM requests)"}, False, False),
])
def test_the_copy_of_a_source_leaves_out_what_detection_does_not_read(store: Path, quiet_store: Path,
                                                                     kw: dict[str, Any], spike: bool,
                                                                     blank: bool) -> None:
    """find_spikes copies a caller's source without ids and dimensions exactly when nothing reads them
    (auto policy, no weight in range, no spike found); build_report always copies them."""
    from analysis.report import SOURCE_TABLE

    con = connect(store if spike else quiet_store)
    kept = ", ".join(f"count({c})" for c in ("trace_id", "span_id", "replica", "tenant", "input_tokens"))
    n = one(con, f"SELECT count(*) FROM {kw['source']}")[0]
    find_spikes(con, **kw)
    counts = one(con, f"SELECT count(*), {kept} FROM {SOURCE_TABLE}")
    assert counts[0] == n
    assert all(c == 0 for c in counts[1:]) if blank else all(c == n for c in counts[1:])
    build_report(con, **kw)
    assert all(c == n for c in one(con, f"SELECT {kept} FROM {SOURCE_TABLE}"))
