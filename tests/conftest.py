"""What every test process shares: no test reaches the developer's default store, and a run that skipped for a
missing prerequisite ends by saying what to install (tests/needs.py).

The suite runs in parallel worker processes (pytest-xdist, `make test`); the rules that keep tests apart are in
CONTRIBUTING.md ("Tests run in parallel").
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from tests import file_seconds
from tests.needs import MISSING, STRICT_ENV
from tracing.store import ENV_STORE

_default_store_dir: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    """Point the default store ($TAILSCOPE_STORE) of this process and its children at a directory of its own:
    a command run without --store then writes there, never into ~/.local/share/tailscope or another worker's."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    where = tempfile.mkdtemp(prefix=f"tailscope-test-default-store-{worker}-")
    _default_store_dir.append(where)
    os.environ[ENV_STORE] = os.path.join(where, "store")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first by their measured seconds (tests/file_seconds.py: the committed table, else 10 s per
    test marked `slow`), the others after in their own order (a stable sort, so a file's tests stay together).
    `make test` hands whole files to its workers in this order (`--dist loadfile --no-loadscope-reorder`): the long
    files start first and the many short ones fill the end of the run on every worker, rather than a long file
    starting last while the other workers are idle."""
    cost = file_seconds.costs(((item.nodeid.split("::", 1)[0], item.get_closest_marker("slow") is not None)
                               for item in items), file_seconds.load())
    items.sort(key=lambda item: -cost[item.nodeid.split("::", 1)[0]])


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the default store directory made in `pytest_configure`."""
    for where in _default_store_dir:
        shutil.rmtree(where, ignore_errors=True)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One list of the prerequisites some tests skipped for, with how to get each (the skips' own reasons)."""
    reasons: set[str] = set()
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = getattr(report, "longrepr", None)
        if isinstance(longrepr, tuple) and len(longrepr) == 3 and MISSING in str(longrepr[2]):
            reasons.add(str(longrepr[2]).split(MISSING, 1)[1])
    if reasons:
        terminalreporter.section("missing prerequisites (tests skipped)")
        for reason in sorted(reasons):
            terminalreporter.line(f"- {reason}")
        terminalreporter.line(f"`make test` installs them and sets {STRICT_ENV}=1, under which they fail instead.")
