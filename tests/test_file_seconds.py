"""tests/file_seconds.py: the table of each test file's seconds by which the workers get the longest files first."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import file_seconds

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="5">
<testcase classname="tests.pkg.test_a" name="test_one" time="1.25"/>
<testcase classname="tests.pkg.test_a" name="test_two[x]" time="2.5"><skipped message="no"/></testcase>
<testcase classname="tests.pkg.test_a.TestGroup" name="test_three" time="0.25"/>
<testcase classname="tests.test_b" name="test_four" time="7"/>
<testcase classname="elsewhere.test_c" name="test_five" time="3"/>
</testsuite></testsuites>
"""


def test_a_reports_seconds_are_summed_per_file_classes_included(tmp_path: Path) -> None:
    for path in ("tests/pkg/test_a.py", "tests/test_b.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    (tmp_path / "suite.xml").write_text(JUNIT)
    assert file_seconds.from_junit(tmp_path / "suite.xml", tmp_path) == {"tests/pkg/test_a.py": 4.0,
                                                                          "tests/test_b.py": 7.0}


def test_a_file_the_table_lacks_counts_ten_seconds_a_slow_test() -> None:
    collected = [("tests/a.py", False), ("tests/new.py", True), ("tests/a.py", True), ("tests/new.py", True),
                 ("tests/new.py", False), ("tests/quick.py", False)]
    assert file_seconds.costs(collected, {"tests/a.py": 3.5, "tests/gone.py": 99.0}) == {
        "tests/a.py": 3.5, "tests/new.py": 2 * file_seconds.SLOW_TEST_S, "tests/quick.py": 0.0}


def test_the_table_is_written_longest_first_and_reads_back(tmp_path: Path) -> None:
    table = tmp_path / "t.json"
    table.write_text(file_seconds.render({"tests/b.py": 2.04, "tests/a.py": 30.0, "tests/c.py": 2.04}))
    assert table.read_text().splitlines()[1:4] == ['  "tests/a.py": 30.0,', '  "tests/b.py": 2.0,',
                                                   '  "tests/c.py": 2.0']
    assert file_seconds.load(table) == {"tests/a.py": 30.0, "tests/b.py": 2.0, "tests/c.py": 2.0}
    assert file_seconds.load(tmp_path / "none.json") == {}


def test_the_committed_table_names_test_files_that_exist() -> None:
    table = file_seconds.load()
    assert table, "tests/file_seconds.json is missing"
    assert [p for p in table if not (file_seconds.ROOT / p).is_file() or not Path(p).name.startswith("test_")] == []
    assert all(s >= 0 for s in table.values())


def test_the_collected_files_come_longest_first(request: pytest.FixtureRequest) -> None:
    """tests/conftest.py's order: files sorted by their cost, each file's tests together. Checked on the collected
    items handed to the hook in reverse, and on this run's own order unless --failed-first or --new-first put some
    tests first on purpose."""
    from tests import conftest

    items = request.session.items
    table = file_seconds.load()

    def check(order: list[pytest.Item]) -> None:
        files = list(dict.fromkeys(item.nodeid.split("::", 1)[0] for item in order))
        assert len(files) == len({item.nodeid.split("::", 1)[0] for item in order})  # each file's tests together
        slow = {f: sum(1 for item in order if item.nodeid.startswith(f + "::") and item.get_closest_marker("slow"))
                for f in files}
        cost = [table.get(f, 10.0 * slow[f]) for f in files]
        assert cost == sorted(cost, reverse=True)

    reordered = list(reversed(items))
    conftest.pytest_collection_modifyitems(reordered)
    assert sorted(item.nodeid for item in reordered) == sorted(item.nodeid for item in items)
    check(reordered)
    if not (request.config.getoption("failedfirst") or request.config.getoption("newfirst")):
        check(items)
