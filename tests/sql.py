"""The one row of a test's SQL query (an aggregate, a lookup), typed: DuckDB's `fetchone` may return None."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import duckdb


def one(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[object] | None = None) -> tuple[Any, ...]:
    """The first row of `sql` on `con`; a query that returns no row fails the test here."""
    row = con.execute(sql, params).fetchone()
    assert row is not None, sql
    return row
