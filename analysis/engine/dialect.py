"""Every SQL spelling that differs between the engines, in one table: the `Dialect`.

The request model (analysis.engine.model), the sampling rules, the cost sweep (analysis.cost)
and the ClickHouse pushdown generate their SQL through a `Dialect`, so the difference between
DuckDB and ClickHouse lives here and nowhere else. ClickHouse's traps, each handled by a field:
window `min` over an empty frame gives 0 (`min_or_null`); an aggregate over no row gives the
type's default (the `OrNull` combinator in `agg_if`); a LEFT JOIN fills defaults unless
`join_use_nulls = 1` (`CLICKHOUSE_SETTINGS`); `round` is banker's for floats (`round_int`);
`quantile` / `median` sample 8,192 rows (use `quantileExactInclusive`, never those).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


def quote(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


@dataclass(frozen=True)
class Dialect:
    """The engine-specific spellings the generated SQL uses; everything else is common SQL."""

    name: str
    #: aggregate `agg(expr)` over the rows where `cond` holds
    agg_if: Callable[[str, str, str], str]
    #: minimum over a window frame that is NULL (not 0) on an empty frame
    min_or_null: Callable[[str], str]
    #: value of `val` on the row with the smallest `key` (a row / tuple of sort keys)
    arg_min: Callable[[str, str], str]
    #: floor division of integers
    int_div: Callable[[str, str], str]
    #: round half away from zero to a 64-bit integer
    round_int: Callable[[str], str]
    #: cast to a 64-bit integer
    int64: Callable[[str], str]
    #: UTC timestamp (microseconds) from integer ns since the epoch
    ts_from_ns: Callable[[str], str]
    #: a tuple of sort keys
    row: Callable[[list[str]], str]
    #: a 64-bit hash of two strings (the join key of a span and of its parent)
    hash2: Callable[[str, str], str]
    #: a 56-bit sampling threshold read off 14 lowercase hex digits
    hex56: Callable[[str], str]
    #: whether text `x` matches regex `rx` (a Python string, quoted here)
    regex_matches: Callable[[str, str], str]
    #: the first capture group of regex `rx` in text `x`
    regex_extract: Callable[[str, str], str]
    #: a double read off text, NULL when it does not read
    to_double_or_null: Callable[[str], str]
    #: the next row's `x` in partition `p` ordered by `o` (NULL on the last row)
    lead: Callable[[str, str, str], str]
    #: a join that adds one row per grid edge `name` in [lo, hi) step `step` (the cost sweep's cells)
    grid_cells: Callable[[str, str, str, str], str]
    #: SELECT `keep`, stage, critical_ns: one row per row of `source` and column of `cols` (`x_ns` -> stage `x`)
    unpivot_stages: Callable[[str, tuple[str, ...], str], str]
    #: a string literal that reads back as the text exactly (ClickHouse reads a backslash as an escape)
    literal: Callable[[str], str]
    #: the value of key `k` (a Python string) in map column `m`, '' when the key is absent
    map_get: Callable[[str, str], str]
    #: whether map column `m` holds key `k`
    map_has: Callable[[str, str], str]
    #: whether the RE2 regex `rx` (a Python string) matches anywhere in text `x` (any backslash kept as written)
    regex_search: Callable[[str, str], str]
    #: text `x` with every `a` replaced by `b` (Python strings)
    replace_all: Callable[[str, str, str], str]
    #: map column `m`'s entries sorted by key (then value): compared as text, the same order in both engines
    sorted_entries: Callable[[str], str]
    #: whether a CTE may be marked MATERIALIZED (computed once)
    materialized_ctes: bool = True
    #: a boolean result as the engine's boolean type
    to_bool: Callable[[str], str] = lambda expr: expr


DUCKDB = Dialect(
    name="duckdb",
    agg_if=lambda agg, expr, cond: f"{agg}({expr}) FILTER (WHERE {cond})",
    min_or_null=lambda expr: f"min({expr})",
    arg_min=lambda val, key: f"arg_min({val}, {key})",
    int_div=lambda a, b: f"({a}) // ({b})",
    round_int=lambda expr: f"round({expr})::BIGINT",  # DuckDB rounds half away from zero
    int64=lambda expr: f"({expr})::BIGINT",
    ts_from_ns=lambda expr: f"make_timestamp(({expr}) // 1000)",
    row=lambda keys: f"row({', '.join(keys)})",
    hash2=lambda a, b: f"hash({a}, {b})",
    hex56=lambda hx: f"TRY_CAST('0x' || {hx} AS BIGINT)",
    regex_matches=lambda x, rx: f"regexp_matches({x}, {quote(rx)})",
    regex_extract=lambda x, rx: f"regexp_extract({x}, {quote(rx)}, 1)",
    to_double_or_null=lambda x: f"TRY_CAST({x} AS DOUBLE)",
    lead=lambda x, p, o: f"lead({x}) OVER (PARTITION BY {p} ORDER BY {o})",
    grid_cells=lambda lo, hi, name, step: f", LATERAL (SELECT unnest(range({lo}, {hi}, {step})) AS {name})",
    literal=quote,
    map_get=lambda m, k: f"coalesce({m}[{quote(k)}], '')",
    map_has=lambda m, k: f"map_contains({m}, {quote(k)})",
    regex_search=lambda x, rx: f"regexp_matches({x}, {quote(rx)})",
    replace_all=lambda x, a, b: f"replace({x}, {quote(a)}, {quote(b)})",
    sorted_entries=lambda m: f"list_sort(map_entries({m}))",
    unpivot_stages=lambda keep, cols, source: f"""
SELECT {keep}, regexp_replace(stage_col, '_ns$', '') AS stage, critical_ns
FROM (UNPIVOT (SELECT {keep}, {', '.join(cols)} FROM {source})
      ON {', '.join(cols)} INTO NAME stage_col VALUE critical_ns)""",
)


def _ch_round_half_away(expr: str) -> str:
    """Round half away from zero exactly: the fraction of |x| below 2**52 is exact in a double."""
    a = f"abs({expr})"
    return f"toInt64(sign({expr}) * (floor({a}) + ({a} - floor({a}) >= 0.5)))"


def _ch_literal(text: str) -> str:
    """A ClickHouse string literal: a backslash starts an escape there, so it is doubled."""
    return quote(text.replace("\\", "\\\\"))


#: Settings every query of the model needs on ClickHouse: unmatched LEFT JOIN columns are NULL (not 0 / ''),
#: and a MATERIALIZED CTE is computed once (without it, each reference recomputes it).
CLICKHOUSE_SETTINGS: dict[str, int] = {"join_use_nulls": 1, "enable_materialized_cte": 1}

CLICKHOUSE = Dialect(
    name="clickhouse",
    # the OrNull combinator: an aggregate over no row is NULL, as in SQL, not the type's default
    agg_if=lambda agg, expr, cond: f"{'argMin' if agg == 'arg_min' else agg}OrNullIf({expr}, {cond})",
    min_or_null=lambda expr: f"minOrNull({expr})",
    arg_min=lambda val, key: f"argMin({val}, {key})",
    int_div=lambda a, b: f"intDiv({a}, {b})",
    round_int=_ch_round_half_away,
    int64=lambda expr: f"toInt64({expr})",
    ts_from_ns=lambda expr: f"fromUnixTimestamp64Micro(intDiv({expr}, 1000), 'UTC')",
    row=lambda keys: f"tuple({', '.join(keys)})",
    hash2=lambda a, b: f"cityHash64({a}, {b})",
    hex56=lambda hx: f"toInt64(reinterpretAsUInt64(reverse(unhex(concat('00', {hx})))))",
    regex_matches=lambda x, rx: f"match({x}, {quote(rx)})",
    regex_extract=lambda x, rx: f"extract({x}, {quote(rx)})",
    to_double_or_null=lambda x: f"toFloat64OrNull({x})",
    lead=lambda x, p, o: (f"leadInFrame(toNullable({x}), 1, NULL) OVER (PARTITION BY {p} ORDER BY {o} "
                          "ROWS BETWEEN CURRENT ROW AND 1 FOLLOWING)"),
    grid_cells=lambda lo, hi, name, step: f" ARRAY JOIN range({lo}, {hi}, {step}) AS {name}",
    literal=_ch_literal,
    map_get=lambda m, k: f"{m}[{_ch_literal(k)}]",  # a Map gives the type's default ('') for an absent key
    map_has=lambda m, k: f"mapContains({m}, {_ch_literal(k)})",
    regex_search=lambda x, rx: f"match({x}, {_ch_literal(rx)})",
    replace_all=lambda x, a, b: f"replaceAll({x}, {_ch_literal(a)}, {_ch_literal(b)})",
    sorted_entries=lambda m: f"arraySort(arrayZip(mapKeys({m}), mapValues({m})))",
    unpivot_stages=lambda keep, cols, source: f"""
SELECT {keep}, sc.1 AS stage, sc.2 AS critical_ns
FROM (SELECT {keep}, arrayJoin([{', '.join(f"({quote(c.removesuffix('_ns'))}, {c})" for c in cols)}]) AS sc
      FROM {source})""",
    to_bool=lambda expr: f"toBool({expr})",
)

#: The dialects by name (the `dialect=` argument some entry points take).
DIALECTS: dict[str, Dialect] = {d.name: d for d in (DUCKDB, CLICKHOUSE)}


def dialect(name: str) -> Dialect:
    """The Dialect called `name` ("duckdb" or "clickhouse"); a ValueError names the known ones."""
    try:
        return DIALECTS[name]
    except KeyError:
        raise ValueError(f"unknown SQL dialect {name!r}: one of {', '.join(DIALECTS)}") from None
