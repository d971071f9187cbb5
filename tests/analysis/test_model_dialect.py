"""The dialect map of the request model: each DuckDB spelling does what the model relies on."""

from __future__ import annotations

import duckdb
import pytest

from analysis.engine import model as M

D = M.DUCKDB


def _one(sql: str) -> object:
    row = duckdb.connect(":memory:").execute(sql).fetchone()
    assert row is not None
    return row[0]


def test_window_min_over_an_empty_frame_is_null() -> None:
    sql = (f"SELECT list(m ORDER BY v) FROM (SELECT v, {D.min_or_null('v')} OVER "
           "(ORDER BY v ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS m FROM (VALUES (3), (1), (2)) t(v))")
    assert _one(sql) == [None, 1, 1]


@pytest.mark.parametrize(("expr", "want"), [("5 / 2", 3), ("-5 / 2", -3), ("7 / 2", 4), ("9 / 4", 2)])
def test_round_is_half_away_from_zero(expr: str, want: int) -> None:
    assert _one(f"SELECT {D.round_int(expr)}") == want


def test_integer_division_arg_min_filter_hash_and_timestamps() -> None:
    assert _one(f"SELECT {D.int_div('7200000000001', str(M.HOUR_NS))}") == 2
    # arg_min: the smallest key; a tuple key breaks ties on its second part
    rows = "(VALUES ('a', 2, 'x'), ('b', 1, 'z'), ('c', 1, 'y')) t(v, s, id)"
    assert _one(f"SELECT {D.arg_min('v', D.row(['s', 'id']))} FROM {rows}") == "c"
    assert _one(f"SELECT {D.agg_if('sum', 's', 'v <> ' + M.quote('a'))} FROM {rows}") == 2
    assert _one(f"SELECT {D.agg_if('sum', 's', 'false')} FROM {rows}") is None
    same = _one(f"SELECT {D.hash2(M.quote('t1'), M.quote('s1'))} = {D.hash2(M.quote('t1'), M.quote('s1'))}")
    swapped = _one(f"SELECT {D.hash2(M.quote('t1'), M.quote('s1'))} = {D.hash2(M.quote('s1'), M.quote('t1'))}")
    assert same is True and swapped is False
    assert str(_one(f"SELECT {D.ts_from_ns('1763647200123456789')}")) == "2025-11-20 14:00:00.123456"
    assert _one(f"SELECT {D.int64('2.0')}") == 2


def test_facts_hold_no_stage_column_and_quote_escapes() -> None:
    with pytest.raises(ValueError, match="no stage column"):
        M.facts_sql(columns=("trace_id", "decode_ns"))
    assert M.quote("it's") == "'it''s'"
