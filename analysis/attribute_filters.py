"""Requests filtered by any attribute, by the report's own rule of one value per request (analysis.stats.attributes).

`attribute_choices` lists what the report would consider over a set of requests: each attribute key, the
source its value comes from (request span, stage spans, the serving process's resource) and its values as the
report writes them (text, or power-of-two buckets of numbers: "0-0", "1024-2047"). `AttributeFilter.where`
is the SQL condition on the `requests` columns that keeps the requests holding one of the chosen values,
read from the same spans by the same rule: a stage key only where every stage span carrying it in the
request's read hours agrees (analysis.engine.model.in_read_hours_sql), a resource key only where the
replica's spans agree. The SQL is generated for a Dialect: DuckDB (a store) or ClickHouse (a table), the
same rule either way; several filters keep the requests meeting all of them (`where_all`).
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
from analysis.engine.dialect import DUCKDB, Dialect
from analysis.stats import attributes as A
from analysis.stats import explain as X

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

    def where(self, alias: str = "", d: Dialect = DUCKDB, requests: str = "requests",
              spans: str = "spans") -> tuple[str, list[Any]]:
        """A SQL condition on the `requests` columns (trace_id, span_id, replica) and its ? parameters (DuckDB;
        on ClickHouse the values are written as literals and no parameter is left). `requests` and `spans` are
        the relations the stage rule and the values are read from."""
        p = f"{alias}." if alias else ""
        sub = one_value_sql(self.key, self.source, d, requests, spans)
        match, params = self._match("x.v", d)
        if self.source == "resource":
            return f"{p}replica IN (SELECT x.Replica FROM {sub} x WHERE {match})", params
        return f"({p}trace_id, {p}span_id) IN (SELECT x.TraceId, x.SpanId FROM {sub} x WHERE {match})", params

    def _match(self, col: str, d: Dialect) -> tuple[str, list[Any]]:
        inline = d is not DUCKDB
        if self.ranges:
            num = d.to_double_or_null(col)
            if inline:
                return "(" + " OR ".join(f"{num} BETWEEN {int(lo)} AND {int(hi)}" for lo, hi in self.ranges) + ")", []
            return ("(" + " OR ".join(f"{num} BETWEEN ? AND ?" for _ in self.ranges) + ")",
                    [x for r in self.ranges for x in r])
        if not self.values:
            return "false", []
        if inline:
            return f"{col} IN ({', '.join(d.literal(v) for v in self.values)})", []
        return f"{col} IN ({', '.join('?' for _ in self.values)})", list(self.values)


def where_all(filters: Sequence[AttributeFilter], alias: str = "", d: Dialect = DUCKDB, requests: str = "requests",
              spans: str = "spans") -> tuple[str, list[Any]]:
    """The requests meeting every filter (one per key: a value among its values), as `AttributeFilter.where`."""
    parts, params = ["true"], []
    for f in filters:
        cond, more = f.where(alias, d, requests, spans)
        parts.append(cond)
        params.extend(more)
    return " AND ".join(parts), params


def attribute_choices(con: duckdb.DuckDBPyConnection, source: str = "requests",
                      rules: A.AttributeRules | None = None, store_rows: bool = False) -> dict[str, dict[str, Any]]:
    """Every attribute the report considers over the requests of relation `source` (analysis.stats.attributes'
    skip rules beside the six built-in dimensions, with the report's patterns unless `rules`), as
    key -> {"source", "kind", "values": [label], "ranges": {label: (lo, hi)}}. `store_rows`: `source` has a `rid`
    column of the store's row ids (analysis.engine.connect: a materialized hour's file and row), so the values
    written with the materialized hours are read, as the report reads them, not computed from the spans."""
    from analysis.engine.attribute_values import stored_values
    from analysis.engine.connect import ROW_ID_FILE_SHIFT
    from analysis.report import attribute_rules  # the report's settings (it does not import this module)

    table = "_tailscope_attr_choice_rows"
    rid = "rid" if store_rows else "(row_number() OVER (ORDER BY trace_id, span_id) - 1)"
    con.execute(f"CREATE OR REPLACE TEMP TABLE {table} AS SELECT {rid} AS rid, trace_id, span_id, start_ns, "
                f"{', '.join(X.DIMENSIONS)} FROM {source}")
    try:
        got = pl.from_arrow(con.sql(f"SELECT * FROM {table} ORDER BY rid").to_arrow_table())
        assert isinstance(got, pl.DataFrame)
        builtin = [X.code_dimension(got, d) for d in X.DIMENSIONS]
        replica = next(c for c in builtin if c.name == "replica")
        rids = got.get_column("rid").to_numpy().astype(np.int64)
        stored = stored_values(con, rids, ROW_ID_FILE_SHIFT) if store_rows else None
        found = A.read_attributes(con, f"SELECT rid, trace_id, span_id, start_ns FROM {table}", {}, rids, replica,
                                  builtin, rules or attribute_rules(), None, None, stored=stored)
    finally:
        con.execute(f"DROP TABLE IF EXISTS {table}")
    return choices_of(found)


def choices_of(found: A.Attributes) -> dict[str, dict[str, Any]]:
    """`attribute_choices` of what the report's attribute pass kept (on either engine)."""
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


def _value(col: str, key: str, d: Dialect) -> tuple[str, str]:
    """(value, present) SQL of `key` in map column `col`: a ClickHouse map gives '' for an absent key."""
    if d is DUCKDB:
        v = f"{col}[{d.literal(key)}]"
        return v, f"{v} IS NOT NULL"
    return f"{col}[{d.literal(key)}]", d.map_has(col, key)


def one_value_sql(key: str, source: str, d: Dialect = DUCKDB, requests: str = "requests", spans: str = "spans") -> str:
    """SQL of each request's one value `v` of attribute `key` from `source` (analysis.stats.attributes' rule), keyed
    by TraceId and SpanId (request: its span's own; stage: the value its trace's stage spans in its read hours
    agree on, the requests read from relation `requests`) or by Replica (resource: the value the replica's request
    and worker-stage spans agree on), from the spans of relation `spans`."""
    if source not in A.SOURCES:
        raise ValueError(f"attribute {key!r}: unknown source {source!r} (one of {', '.join(A.SOURCES)})")
    if source == "request":
        v, has = _value("SpanAttributes", key, d)
        # of a request span stored more than once, the copy the request model reads (analysis.engine.model)
        one = M.request_copy_sql(d, spans, "TRUE", {"v": v, "has_v": has})
        return f"(SELECT TraceId, SpanId, v FROM ({one}) WHERE has_v)"
    if source == "stage":
        v, has = _value("SpanAttributes", key, d)
        # (an inner name apart from the outer `v`: ClickHouse would read `v` in HAVING as the outer alias)
        return (f"(SELECT r.trace_id AS TraceId, r.span_id AS SpanId, min(s.sv) AS v FROM {requests} r "
                f"JOIN (SELECT TraceId, TimestampNs AS ts, {v} AS sv FROM {spans} "
                f"WHERE Stage IS NOT NULL AND NOT IsRequest AND {has}) s ON s.TraceId = r.trace_id "
                f"WHERE {M.in_read_hours_sql('s.ts', 'r.start_ns', d)} "
                "GROUP BY r.trace_id, r.span_id HAVING min(s.sv) = max(s.sv))")
    v, has = _value("ResourceAttributes", key, d)
    worker = ", ".join(M.quote(s) for s in M.WORKER_STAGES)
    return (f"(SELECT Replica, min(rv) AS v FROM (SELECT Replica, {v} AS rv FROM {spans} "
            f"WHERE Replica IS NOT NULL AND (IsRequest OR Stage IN ({worker})) AND {has}) "
            "GROUP BY Replica HAVING min(rv) = max(rv))")


def value_relation(source: str, key: str, choice: dict[str, Any], column: str = "replica", where: str = "true",
                   d: Dialect = DUCKDB, requests: str = "requests", spans: str = "spans") -> str:
    """SQL of the rows of relation `source` (requests) that `where` keeps, with `column` replaced by each request's
    value of attribute `key` as the report writes it (`choice`: its entry of `attribute_choices`; NULL where the
    request has none; on ClickHouse read with join_use_nulls = 1)."""
    on = {"request": "x.TraceId = r.trace_id AND x.SpanId = r.span_id",
          "stage": "x.TraceId = r.trace_id AND x.SpanId = r.span_id", "resource": "x.Replica = r.replica"}
    join = f"LEFT JOIN {one_value_sql(key, choice['source'], d, requests, spans)} x ON {on[choice['source']]}"
    if choice["kind"] == "number":
        num = d.to_double_or_null("x.v")
        label = "CASE " + " ".join(f"WHEN {num} BETWEEN {int(lo)} AND {int(hi)} THEN {d.literal(lab)}"
                                   for lab, (lo, hi) in choice["ranges"].items()) + " END"
    else:
        label = "x.v"
    return f"(SELECT r.* REPLACE ({label} AS {column}) FROM (SELECT * FROM {source} WHERE {where}) r {join})"


def by_attribute(con: duckdb.DuckDBPyConnection, key: str, choice: dict[str, Any], metric: str = "e2e",
                 source: str = "requests", where: str = "true", params: Sequence[object] = ()) -> pl.DataFrame:
    """Per value of attribute `key` ('(none)' where a request has none): the columns and outlier rule of
    analysis.breakdowns.replicas, its `replica` column named `value`."""
    # filtered before the replica column is replaced; the stage rule reads the requests of `source`
    rel = value_relation(source, key, choice, where=where, requests=source)
    return B.replicas(con, metric, rel, "true", params).rename({"replica": "value"})
