"""Each test file's seconds in a whole-suite run (tests/file_seconds.json), by which tests/conftest.py hands the
files to `make test`'s workers: the longest first, so that the run ends on every worker at about the same time.

A file not in the table counts SLOW_TEST_S for each of its tests marked `slow` (a test is marked slow when it takes
more than about ten seconds). Refresh the table from a whole run of the suite, the way CI runs it (`.ci/run` writes
each test's seconds to test-artifacts/suite.xml; `make test PYTEST_ARGS=--junitxml=test-artifacts/suite.xml` does
the same), on a quiet machine:

    CI=true bash .ci/run
    .venv/bin/python -m tests.file_seconds test-artifacts/suite.xml

Each test's time in the JUnit report is its setup, call and teardown (a module fixture counts in the first test
that uses it), so a file's seconds are what its worker spent on it, waiting included.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLE = Path(__file__).with_name("file_seconds.json")
#: the seconds a test marked `slow` counts for in a file the table does not have
SLOW_TEST_S = 10.0


def load(table: Path = TABLE) -> dict[str, float]:
    """The committed table: test file (path from the repository's root) -> seconds; empty without one."""
    return json.loads(table.read_text()) if table.exists() else {}


def _file_of(classname: str, root: Path) -> str | None:
    """The test file a JUnit `classname` names (`tests.pkg.test_x` or `tests.pkg.test_x.TestCase`), or None."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        path = Path(*parts[:end]).with_suffix(".py")
        if (root / path).is_file():
            return path.as_posix()
    return None


def from_junit(report: Path, root: Path = ROOT) -> dict[str, float]:
    """Seconds per test file in a JUnit XML report (pytest --junitxml), summed over its test cases."""
    seconds: dict[str, float] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        path = _file_of(case.get("classname", ""), root)
        if path is not None:
            seconds[path] = seconds.get(path, 0.0) + float(case.get("time", "0"))
    return seconds


def costs(files: Iterable[tuple[str, bool]], table: Mapping[str, float]) -> dict[str, float]:
    """Each file's expected seconds from (file, marked slow) per collected test: the table's, else SLOW_TEST_S per
    test marked slow."""
    slow: dict[str, int] = {}
    for path, is_slow in files:
        slow[path] = slow.get(path, 0) + is_slow
    return {path: table[path] if path in table else SLOW_TEST_S * n for path, n in slow.items()}


def render(seconds: Mapping[str, float]) -> str:
    """The table's text: one file a line, the longest first, seconds to a tenth."""
    rows = sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0]))
    return "{\n" + ",\n".join(f"  {json.dumps(path)}: {round(s, 1)}" for path, s in rows) + "\n}\n"


def main(argv: list[str]) -> None:
    """Write the table from the JUnit report named in `argv`."""
    if len(argv) != 1:
        sys.exit("usage: python -m tests.file_seconds SUITE.xml (a whole run's pytest --junitxml report)")
    try:
        seconds = from_junit(Path(argv[0]))
    except (OSError, ET.ParseError) as exc:
        sys.exit(f"{argv[0]}: not a readable JUnit XML report ({exc})")
    if not seconds:
        sys.exit(f"{argv[0]}: no test case of a file under {ROOT}")
    TABLE.write_text(render(seconds))
    print(f"{TABLE.relative_to(ROOT)}: {len(seconds)} files, {sum(seconds.values()):,.0f} s in all")


if __name__ == "__main__":
    main(sys.argv[1:])
