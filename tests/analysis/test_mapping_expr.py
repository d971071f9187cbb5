"""The rule language of `tailscope map`: errors with their column, and the SQL of both engines against the
plain-Python reference (`expr.evaluate`) on random expressions over random spans."""

from __future__ import annotations

import random

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysis.mapping import expr as E
from analysis.mapping.rules import Mapping, MappingError
from tracing import schema as S


@pytest.mark.parametrize(("text", "message"), [
    ("http.route == ", "column 15 of 'http.route == ': expected a quoted string or a number, found the end"),
    ('name = "x"', "column 6 of 'name = \"x\"': unexpected character '=' (compare with ==)"),
    ('(a == "b"', "column 10 of '(a == \"b\"': expected ')', found the end"),
    ('kind == "serv"', "column 9 of 'kind == \"serv\"': kind is one of Unspecified, Internal, Server, Client, "
                       "Producer, Consumer"),
    ('x =~ "(?=a)"', "column 7 of 'x =~ \"(?=a)\"': lookarounds and backreferences are not RE2: the SQL engines "
                     "cannot run them"),
    ('x =~ "a(b"', "column 8 of 'x =~ \"a(b\"': bad regular expression (missing ), unterminated subpattern)"),
    ('a < "3"', "column 5 of 'a < \"3\"': < compares numbers: write the number without quotes"),
    ("a in [1", "column 8 of 'a in [1': expected ',' or ']', found the end"),
    ('a == "x" b == "y"', "column 10 of 'a == \"x\" b == \"y\"': expected and, or or the end, found 'b'"),
    ("", "column 1 of '': empty expression"),
    ('resource. == "x"', "column 1 of 'resource. == \"x\"': a key is missing after 'resource.'"),
    ('a == "\\q"', "column 7 of 'a == \"\\\\q\"': unknown escape \\q (use \\\\ for a backslash)"),
])
def test_a_bad_expression_names_its_column(text: str, message: str) -> None:
    with pytest.raises(E.ExpressionError) as err:
        E.parse(text)
    assert str(err.value) == message


def test_the_issue_rules_parse_to_what_they_say() -> None:
    node = E.parse('http.route == "/v1/chat/completions"')
    assert node == E.Cmp(E.Field("attr", "http.route"), "==", ("/v1/chat/completions",))
    node = E.parse('name == "tokenize" and resource.k8s.pod.name =~ "^chat-" and not status in ["error"]')
    assert node == E.BoolOp("and", (E.Cmp(E.Field("span", "name"), "==", ("tokenize",)),
                                    E.Cmp(E.Field("resource", "k8s.pod.name"), "=~", ("^chat-",)),
                                    E.Not(E.Cmp(E.Field("span", "status"), "in", ("Error",)))))
    # precedence: not > and > or
    assert E.parse('a == "1" or b == "2" and not c == "3"') == E.BoolOp("or", (
        E.Cmp(E.Field("attr", "a"), "==", ("1",)),
        E.BoolOp("and", (E.Cmp(E.Field("attr", "b"), "==", ("2",)), E.Not(E.Cmp(E.Field("attr", "c"), "==", ("3",)))))))


def test_a_mapping_names_the_rule_that_is_wrong() -> None:
    with pytest.raises(MappingError, match=r"^--stage generation: column 6 of 'name = \"generate\"'"):
        Mapping(request='http.route == "/x"', stages=(("generation", 'name = "generate"'),))
    with pytest.raises(MappingError, match="unknown stage 'gen'"):
        Mapping(request='http.route == "/x"', stages=(("gen", 'name == "generate"'),))
    with pytest.raises(MappingError, match="write attr:KEY"):
        Mapping(request='http.route == "/x"', shape=(("tenant", "customer.id"),))


# --- the SQL of both engines against the reference ------------------------------------------------------------

_KEYS = ("a", "b.c", "http.response.status_code", "we ird")
_VALUES = ("", "x", "500", "499", "12.5", "-3", "abc def", "1e3", "ÄÖ", "a'b", 'a"b', "back\\slash", " 7", "007",
           "x\\d")
_RX = ("^x$", "x", "5..", "^[0-9]+$", "\\d", "a.b", "(?i)ABC", "^$", "\\\\", "'", "[.]5$")


def _fields() -> st.SearchStrategy[E.Field]:
    return st.one_of(st.sampled_from([E.Field("span", k) for k in E.SPAN_FIELDS]),
                     st.builds(E.Field, st.sampled_from(["attr", "resource"]), st.sampled_from(_KEYS)))


def _value_for(f: E.Field) -> st.SearchStrategy[str | float]:
    if f.source == "span" and f.key == "kind":
        return st.sampled_from(S.SPAN_KINDS)
    if f.source == "span" and f.key == "status":
        return st.sampled_from(S.STATUS_CODES)
    return st.one_of(st.sampled_from(_VALUES), st.sampled_from([500.0, 499.0, 12.5, -3.0, 7.0, 0.0, 1000.0]))


@st.composite
def _cmp(draw: st.DrawFn) -> E.Node:
    f = draw(_fields())
    enum = f.source == "span" and f.key in ("kind", "status")
    op = draw(st.sampled_from(["==", "!=", "in"] if enum else ["==", "!=", "=~", "!~", "<", "<=", ">", ">=", "in",
                                                                 "exists"]))
    if op == "exists":
        return E.Exists(f)
    if op in ("=~", "!~"):
        return E.Cmp(f, op, (draw(st.sampled_from(_RX)),))
    if op in ("<", "<=", ">", ">="):
        return E.Cmp(f, op, (draw(st.sampled_from([500.0, 499.5, 0.0, -3.0, 12.5])),))
    if op == "in":
        return E.Cmp(f, op, tuple(draw(st.lists(_value_for(f), min_size=1, max_size=3))))
    return E.Cmp(f, op, (draw(_value_for(f)),))


_EXPRS = st.recursive(_cmp(), lambda inner: st.one_of(
    st.builds(E.Not, inner),
    st.builds(E.BoolOp, st.sampled_from(["and", "or"]), st.lists(inner, min_size=2, max_size=3).map(tuple))),
    max_leaves=6)


def _spans(seed: int, n: int = 60) -> list[dict[str, object]]:
    rng = random.Random(seed)

    def attrs() -> dict[str, str]:
        return {k: rng.choice(_VALUES) for k in _KEYS if rng.random() < 0.5}

    return [{"SpanName": rng.choice(["tokenize", "generate", "x", ""]), "SpanKind": rng.choice(S.SPAN_KINDS),
             "StatusCode": rng.choice(S.STATUS_CODES), "ServiceName": rng.choice(["svc", "a'b"]),
             "ScopeName": rng.choice(["app", ""]), "SpanAttributes": attrs(), "ResourceAttributes": attrs()}
            for _ in range(n)]


SPANS = _spans(1)


@pytest.fixture(scope="module")
def duck() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(":memory:")
    con.execute("CREATE TABLE t (i INTEGER, SpanName VARCHAR, SpanKind VARCHAR, StatusCode VARCHAR, "
                "ServiceName VARCHAR, ScopeName VARCHAR, SpanAttributes MAP(VARCHAR, VARCHAR), "
                "ResourceAttributes MAP(VARCHAR, VARCHAR))")
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [[i, s["SpanName"], s["SpanKind"], s["StatusCode"], s["ServiceName"], s["ScopeName"],
                      s["SpanAttributes"], s["ResourceAttributes"]] for i, s in enumerate(SPANS)])
    return con


def _ch_lit(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _ch_map(m: object) -> str:
    assert isinstance(m, dict)
    return "map(" + ", ".join(f"{_ch_lit(k)}, {_ch_lit(v)}" for k, v in m.items()) + ")"


_CH_ROWS = ", ".join(
    f"({i}, {_ch_lit(str(s['SpanName']))}, {_ch_lit(str(s['SpanKind']))}, {_ch_lit(str(s['StatusCode']))}, "
    f"{_ch_lit(str(s['ServiceName']))}, {_ch_lit(str(s['ScopeName']))}, {_ch_map(s['SpanAttributes'])}, "
    f"{_ch_map(s['ResourceAttributes'])})" for i, s in enumerate(SPANS))
_CH_SOURCE = ("(SELECT tupleElement(x, 1) AS i, tupleElement(x, 2) AS SpanName, tupleElement(x, 3) AS SpanKind, "
              "tupleElement(x, 4) AS StatusCode, tupleElement(x, 5) AS ServiceName, tupleElement(x, 6) AS ScopeName, "
              "CAST(tupleElement(x, 7), 'Map(String, String)') AS SpanAttributes, "
              "CAST(tupleElement(x, 8), 'Map(String, String)') AS ResourceAttributes "
              f"FROM (SELECT arrayJoin([{_CH_ROWS}]) AS x))")


@settings(max_examples=150, deadline=None)
@given(node=_EXPRS)
def test_duckdb_sql_equals_the_reference(node: E.Node, duck: duckdb.DuckDBPyConnection) -> None:
    assert E.parse(E.to_text(node)) == node  # the text form reads back as the same rule
    got = [bool(v) for (v,) in duck.execute(f"SELECT {E.to_sql(node, 'duckdb')} FROM t ORDER BY i").fetchall()]
    assert got == [E.evaluate(node, s) for s in SPANS], E.to_text(node)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(nodes=st.lists(_EXPRS, min_size=50, max_size=50))  # many per query: each chdb query costs ~0.5 s to plan
def test_clickhouse_sql_equals_the_reference(nodes: list[E.Node]) -> None:
    chdb = pytest.importorskip("chdb")
    cols = ", ".join(f"toUInt8({E.to_sql(n, 'clickhouse')})" for n in nodes)
    out = chdb.query(f"SELECT {cols} FROM {_CH_SOURCE} ORDER BY i FORMAT TSV").bytes().decode()
    got = [[v == "1" for v in line.split("\t")] for line in out.splitlines()]
    assert got == [[E.evaluate(n, s) for n in nodes] for s in SPANS], [E.to_text(n) for n in nodes]
