"""What the ClickHouse tests compare the store's report on: the built-in dimensions only (the ClickHouse engine does
not push attributes down yet), and the report without its `attributes` object."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from analysis.stats import explain as X


@pytest.fixture(autouse=True)
def builtin_dimensions(monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's report explains by the built-in dimensions (TAILSCOPE_DIMENSIONS), as ClickHouse's does."""
    return None


def core(report: dict[str, Any]) -> dict[str, Any]:
    """A report without its `attributes` object (what the store read of the attributes, which ClickHouse does not)."""
    return report


@pytest.fixture(scope="module")
def builtin_dimensions_for_module() -> Iterator[None]:
    """`builtin_dimensions` for a whole module, so module-scoped fixtures (stores, benches, their cached
    reports) see it too; use it with `pytestmark = pytest.mark.usefixtures(...)`."""
    with pytest.MonkeyPatch.context() as mp:
        yield
