"""A ClickHouse client wrapper for tests: it keeps every query's SQL and answer, in order, so a test can count the
queries a step sends and the rows they bring back (the attribute pass's apart)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from analysis.clickhouse.attributes import ATTR_PREFIX
from analysis.clickhouse.client import Client


class Passing:
    """A Client passing every call to `inner`: a test's wrapper overrides the calls it watches or changes, and
    stands wherever the engine's client does."""

    def __init__(self, inner: Client) -> None:
        self.inner, self.dsn = inner, inner.dsn

    def query(self, sql: str, settings: dict[str, Any] | None = None) -> pa.Table:
        return self.inner.query(sql, settings)

    def command(self, sql: str) -> None:
        self.inner.command(sql)

    def insert_arrow(self, table: str, data: pa.Table) -> None:
        self.inner.insert_arrow(table, data)

    def close(self) -> None:
        self.inner.close()


class Recording(Passing):
    """Passes every call to `inner` and records each query's (SQL, answer); `clear()` starts the count again."""

    def __init__(self, inner: Client) -> None:
        super().__init__(inner)
        self.answers: list[tuple[str, pa.Table]] = []

    def query(self, sql: str, settings: dict[str, Any] | None = None) -> pa.Table:
        out = self.inner.query(sql, settings)
        self.answers.append((sql, out))
        return out

    def clear(self) -> None:
        self.answers.clear()

    @property
    def queries(self) -> int:
        return len(self.answers)

    @property
    def attribute_each(self) -> list[int]:
        """The rows of each query of the attribute pass (its figures, and the exemplars' few requests), in order."""
        return [out.num_rows for sql, out in self.answers if ATTR_PREFIX in sql]

    @property
    def attribute_rows(self) -> int:
        return sum(self.attribute_each)

    @property
    def rows(self) -> int:
        """The rows of every other query."""
        return sum(out.num_rows for sql, out in self.answers if ATTR_PREFIX not in sql)

    @property
    def ties(self) -> int:
        """The detection's groups of tied values above the pooled p99 (among `rows`)."""
        return sum(out.num_rows for sql, out in self.answers
                   if ATTR_PREFIX not in sql and sql.startswith("SELECT lo_rank, c FROM"))
