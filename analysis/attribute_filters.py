"""Requests filtered by any attribute, by the report's own rule of one value per request (analysis.stats.attributes).

`attribute_choices` lists what the report would consider over a set of requests: each attribute key, the
source its value comes from (request span, stage spans, the serving process's resource) and its values as the
report writes them (text, or power-of-two buckets of numbers: "0-0", "1024-2047"). `AttributeFilter.where`
is the SQL condition on the `requests` columns that keeps the requests holding one of the chosen values,
read from the same spans by the same rule: a stage key only where every stage span carrying it agrees, a
resource key only where the replica's spans agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import duckdb
import numpy as np
import polars as pl

from analysis import breakdowns as B
from analysis.engine import model as M
from analysis.stats import attributes as A
from analysis.stats.explain import Coded

#: Kinds of attribute values the filter reads (a number bucketed with fractional ends is not offered).
KINDS: Final[tuple[str, ...]] = ("text", "number")


@dataclass(frozen=True)
class AttributeFilter:
    """Keep the requests whose attribute `key` (read from `source`) holds one of `values` (text), or, for a
    number, falls in one of the buckets `ranges` ((lo, hi), both ends included; `values` are their labels)."""

    key: str
    source: str
    values: tuple[str, ...]
    ranges: tuple[tuple[int, int], ...] = ()

    def where(self, alias: str = "") -> tuple[str, list[Any]]:
        """A SQL condition on the `requests` columns (trace_id, span_id, replica) and its ? parameters."""
        p = f"{alias}." if alias else ""
        sub = one_value_sql(self.key, self.source)
        match, params = self._match("x.v")
        if self.source == "request":
            return (f"EXISTS (SELECT 1 FROM {sub} x WHERE x.TraceId = {p}trace_id AND x.SpanId = {p}span_id "
                    f"AND {match})"), params
        if self.source == "stage":
            return f"{p}trace_id IN (SELECT x.TraceId FROM {sub} x WHERE {match})", params
        return f"{p}replica IN (SELECT x.Replica FROM {sub} x WHERE {match})", params

    def _match(self, col: str) -> tuple[str, list[Any]]:
        if self.ranges:
            num = f"TRY_CAST({col} AS DOUBLE)"
            return ("(" + " OR ".join(f"{num} BETWEEN ? AND ?" for _ in self.ranges) + ")",
                    [x for r in self.ranges for x in r])
        if not self.values:
            return "false", []
        return f"{col} IN ({', '.join('?' for _ in self.values)})", list(self.values)


def _frame(con: duckdb.DuckDBPyConnection, source: str) -> tuple[np.ndarray, Coded]:
    rows = con.sql(f"SELECT replica FROM {source} ORDER BY trace_id, span_id").fetchall()
    labels = sorted({r[0] for r in rows if r[0] is not None})
    at = {label: i for i, label in enumerate(labels)}
    codes = np.array([at.get(r[0], -1) if r[0] is not None else -1 for r in rows], dtype=np.int64)
    return np.arange(len(rows), dtype=np.int64), Coded("replica", codes, labels, [None] * len(labels),
                                                         [None] * len(labels))


def attribute_choices(con: duckdb.DuckDBPyConnection, source: str = "requests") -> dict[str, dict[str, Any]]:
    """Every attribute the report considers over the requests of relation `source` (the skip rules of
    analysis.stats.attributes), as key -> {"source", "kind", "values": [label], "ranges": {label: (lo, hi)}}."""
    rid, replica = _frame(con, source)
    facts = (f"SELECT (row_number() OVER (ORDER BY trace_id, span_id) - 1) AS rid, trace_id, span_id, start_ns "
             f"FROM {source}")
    found = A.read_attributes(con, facts, {}, rid, replica, [replica], A.AttributeRules(), None, None)
    kinds = {(c["attribute"], c["source"]): c["kind"] for c in found.considered}
    out: dict[str, dict[str, Any]] = {}
    for coded in found.coded:
        key, src = getattr(coded, "attribute", coded.name), getattr(coded, "source", "request")
        kind = kinds.get((key, src), "text")
        ranges = {label: (int(lo), int(hi)) for label, lo, hi in zip(coded.labels, coded.lo, coded.hi, strict=True)
                  if lo is not None and hi is not None}
        if kind == "number" and len(ranges) < len(coded.labels):
            continue  # numbers bucketed with fractional ends: not offered
        out[key] = {"source": src, "kind": kind, "values": list(coded.labels), "ranges": ranges}
    return dict(sorted(out.items()))


def attribute_filter(choices: dict[str, dict[str, Any]], key: str, values: tuple[str, ...]) -> AttributeFilter:
    """The filter keeping requests whose `key` holds one of `values` (labels among `choices[key]["values"])."""
    if key not in choices:
        raise ValueError(f"attribute {key!r} is not among the attributes the report considers here")
    c = choices[key]
    kept = tuple(v for v in values if v in c["values"])
    ranges = tuple(c["ranges"][v] for v in kept) if c["kind"] == "number" else ()
    return AttributeFilter(key, c["source"], kept, ranges)


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def one_value_sql(key: str, source: str) -> str:
    """SQL of each request's one value `v` of attribute `key` from `source` (analysis.stats.attributes' rule), keyed
    by TraceId and SpanId (request), TraceId (stage: the value its stage spans agree on) or Replica (resource: the
    value the replica's request and worker-stage spans agree on)."""
    if source not in A.SOURCES:
        raise ValueError(f"attribute {key!r}: unknown source {source!r} (one of {', '.join(A.SOURCES)})")
    k = _lit(key)
    if source == "request":
        return f"(SELECT TraceId, SpanId, SpanAttributes[{k}] AS v FROM spans WHERE IsRequest)"
    if source == "stage":
        return (f"(SELECT TraceId, min(v) AS v FROM (SELECT TraceId, SpanAttributes[{k}] AS v FROM spans "
                "WHERE Stage IS NOT NULL AND NOT IsRequest) WHERE v IS NOT NULL GROUP BY TraceId "
                "HAVING min(v) = max(v))")
    worker = ", ".join(f"'{s}'" for s in M.WORKER_STAGES)
    return (f"(SELECT Replica, min(v) AS v FROM (SELECT Replica, ResourceAttributes[{k}] AS v FROM spans "
            f"WHERE Replica IS NOT NULL AND (IsRequest OR Stage IN ({worker}))) WHERE v IS NOT NULL "
            "GROUP BY Replica HAVING min(v) = max(v))")


def value_relation(source: str, key: str, choice: dict[str, Any], column: str = "replica", where: str = "true") -> str:
    """SQL of the rows of relation `source` (requests) that `where` keeps, with `column` replaced by each request's
    value of attribute `key` as the report writes it (`choice`: its entry of `attribute_choices`; NULL where the
    request has none)."""
    on = {"request": "x.TraceId = r.trace_id AND x.SpanId = r.span_id", "stage": "x.TraceId = r.trace_id",
          "resource": "x.Replica = r.replica"}[choice["source"]]
    join = f"LEFT JOIN {one_value_sql(key, choice['source'])} x ON {on}"
    if choice["kind"] == "number":
        num = "TRY_CAST(x.v AS DOUBLE)"
        label = "CASE " + " ".join(f"WHEN {num} BETWEEN {lo} AND {hi} THEN {_lit(lab)}"
                                   for lab, (lo, hi) in choice["ranges"].items()) + " END"
    else:
        label = "x.v"
    return f"(SELECT r.* REPLACE ({label} AS {column}) FROM (SELECT * FROM {source} WHERE {where}) r {join})"


def by_attribute(con: duckdb.DuckDBPyConnection, key: str, choice: dict[str, Any], metric: str = "e2e",
                 source: str = "requests", where: str = "true", params: Sequence[object] = ()) -> pl.DataFrame:
    """Per value of attribute `key` ('(none)' where a request has none): the columns and outlier rule of
    analysis.breakdowns.replicas, its `replica` column named `value`."""
    rel = value_relation(source, key, choice, where=where)  # filtered before the replica column is replaced
    return B.replicas(con, metric, rel, "true", params).rename({"replica": "value"})
