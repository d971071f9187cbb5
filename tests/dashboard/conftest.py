"""Fixture stores for the dashboard tests: a synthetic incident (replica-05 decode spike) and an empty store."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tests.dashboard.incident_store import Incident, write_incident_store
from tracing.store import init_store

#: Requests in the incident fixture (7 spans each).
REQUESTS = 20_000
APP = Path(__file__).parents[2] / "dashboard" / "app.py"
_ROW = re.compile(r"(?<!\\)\|")
_RULE = re.compile(r"^\|(?:\s*:?-{3,}:?\s*\|)+$")


def shown_tables(at: Any) -> list[pd.DataFrame]:
    """The Markdown tables an AppTest run shows (the pages' small tables: dashboard.formats.table), in order: each
    cell's text as a reader sees it (Markdown escapes taken out) under its column's header."""
    out = []
    for md in at.markdown:
        lines = str(md.value).splitlines()
        if len(lines) < 2 or not lines[0].startswith("|") or not _RULE.match(lines[1].replace(" ", "")):
            continue
        rows = [[re.sub(r"\\(.)", r"\1", c.strip()) for c in _ROW.split(line)[1:-1]] for line in lines]
        out.append(pd.DataFrame(rows[2:], columns=rows[0]))
    return out


@pytest.fixture(scope="session")
def incident(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Incident]:
    """A store of 20,000 requests over 30 minutes; replica-05 decodes 6× slower from minute 18 to 22.5."""
    store = tmp_path_factory.mktemp("incident") / "store"
    where = write_incident_store(store, requests=REQUESTS, duration_s=1_800.0)
    return store, where


@pytest.fixture(scope="session")
def incident_store(incident: tuple[Path, Incident]) -> Path:
    """The incident store's directory."""
    return incident[0]


@pytest.fixture(scope="session")
def empty_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with no segments."""
    return init_store(tmp_path_factory.mktemp("empty") / "store")


@pytest.fixture(autouse=True)
def restore_main_module() -> Iterator[None]:
    """Put back `sys.modules["__main__"]` after each test: AppTest leaves the app script there,
    and a later test's multiprocessing "spawn" child would then run the dashboard as its main."""
    main = sys.modules["__main__"]
    yield
    sys.modules["__main__"] = main
