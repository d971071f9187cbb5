"""Fixtures shared by the analysis tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from analysis.clickhouse import client as C
from tests.needs import CHDB_HOW, need_module


@pytest.fixture(scope="module")
def chdb_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """An empty chdb session of the module's own, closed after its last test (chdb missing: skipped, or failed under
    `make test`, with how to install it)."""
    need_module("chdb", CHDB_HOW)
    c = C.open_client(f"chdb:{tmp_path_factory.mktemp('chdb')}")
    yield c
    c.close()
