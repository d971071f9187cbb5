"""tests/clickhouse_memo.py answers what the engine answers: random statements (session tables made again alike or
not, dropped, read, joined, the outside table written, system tables read) run on chdb twice, through the memo on
tables `m_*` and straight on tables `p_*` of the same session; every answer and every failure is the same, while
the memo answered repeated reads and kept tables made again alike without running them."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.clickhouse_memo import Memo
from tests.needs import CHDB_HOW, need_module

NAMES = ("t0", "t1", "t2")
#: Session tables made from a source `{src}` (the outside table or another session table).
MAKES = ("SELECT x, y FROM {src} WHERE x % 3 = 1", "SELECT x + 1 AS x, y FROM {src}",
         "SELECT x, toInt64(count()) AS y FROM {src} GROUP BY x", "SELECT x, y * 2 AS y FROM {src} WHERE y > 3")
READS = ("SELECT toInt64(count()) AS n, sum(x) AS sx, sum(y) AS sy FROM {a}",
         "SELECT toInt64(count()) AS n FROM {a} AS l INNER JOIN {b} AS r ON l.x = r.x",
         "SELECT x, y FROM {a} ORDER BY x, y LIMIT 3")


def _outcome(run: Any) -> Any:
    """The answer (rows) of `run()`, or the failure's class."""
    try:
        out = run()
    except Exception as exc:
        return type(exc).__name__
    return None if out is None else out.to_pylist()


def _step(rng: random.Random) -> tuple[str, str]:
    """One random statement over prefix `@` (a table name is `@name`): (kind, text)."""
    kind = rng.choices(["make", "make_bare", "drop", "read", "read", "insert", "system"], [6, 1, 3, 6, 6, 0.4, 1])[0]
    name = rng.choice(NAMES)
    if kind in ("make", "make_bare"):  # mostly the name's usual text (t0 from the outside table, t1 from t0, ...)
        i = NAMES.index(name)
        src, make = (("@base" if i == 0 else f"@{NAMES[i - 1]}"), MAKES[i]) if rng.random() < 0.7 else (
            rng.choice(["@base", *(f"@{n}" for n in NAMES if n != name)]), rng.choice(MAKES))
        return kind, f"CREATE TEMPORARY TABLE @{name} ENGINE = Memory AS " + make.format(src=src)
    if kind == "drop":
        return kind, f"DROP TEMPORARY TABLE IF EXISTS @{name}"
    if kind == "read":
        a, b = (rng.choice(["@base", *(f"@{n}" for n in NAMES)]) for _ in range(2))
        return kind, rng.choice(READS).format(a=a, b=b)
    if kind == "insert":
        return kind, f"INSERT INTO @base SELECT number % 7, number FROM numbers({rng.randint(1, 9)})"
    return kind, "SELECT replaceOne(name, '@', '') AS n FROM system.tables WHERE is_temporary AND " \
                 "startsWith(name, '@') ORDER BY n"


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Any:
    need_module("chdb", CHDB_HOW)
    from analysis import clickhouse as C

    c = C.open_client(f"chdb:{tmp_path_factory.mktemp('memo')}")
    yield c
    c.close()


def test_the_memo_answers_as_the_engine_does(client: Any) -> None:
    for prefix in ("m_", "p_"):
        client.command(f"DROP TABLE IF EXISTS {prefix}base")
        client.command(f"CREATE TABLE {prefix}base (x Int64, y Int64) ENGINE = Memory")
        client.command(f"INSERT INTO {prefix}base SELECT number % 5, number FROM numbers(12)")
    memo = Memo(client)
    rng = random.Random(7)
    kinds: dict[str, int] = {}
    reads: list[str] = []
    for i in range(200):
        kind, text = _step(rng)
        if kind == "read" and reads and rng.random() < 0.7:  # a read asked again (maybe on other data by now)
            text = rng.choice(reads[-4:])
        reads += [text] if kind == "read" else []
        kinds[kind] = kinds.get(kind, 0) + 1
        got: list[object] = []
        want: list[object] = []
        for prefix, target, out in (("m_", memo, got), ("p_", client, want)):
            sql = text.replace("@", prefix)
            # a make drops first, as analysis.clickhouse.model.temp_table makes a session table; a bare one does not
            for s in ([f"DROP TEMPORARY TABLE IF EXISTS {sql.split()[3]}"] if kind == "make" else []) + [sql]:
                if kind in ("read", "system"):
                    out.append(_outcome(lambda s=s, target=target: target.query(s)))
                else:
                    out.append(_outcome(lambda s=s, target=target: target.command(s)))
        assert got == want, (i, kind, text)
    assert min(kinds.values()) > 0
    assert memo.answered >= 10 and memo.kept >= 3, (memo.answered, memo.kept)  # it did answer and keep


def test_a_read_that_changes_from_run_to_run_always_runs(client: Any) -> None:
    memo = Memo(client)
    for sql in ("SELECT rand() AS r", "SELECT count() AS n FROM system.one", "SELECT now64(9) AS t"):
        memo.query(sql)
        memo.query(sql)
    memo.query("SELECT 1 AS x")
    memo.query("SELECT 1 AS x")
    memo.query("SELECT 1 AS x", {"max_threads": 1})  # other settings: another statement
    assert (memo.runs, memo.answered) == (8, 1)
