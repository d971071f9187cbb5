"""Every view column is documented in docs/schema.md, and the documented SQL examples run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from analysis import connect
from analysis.engine.views import PUBLIC_VIEWS
from tests.factory import add_request, write
from tracing.rows import SpanBatch

DOCS = Path(__file__).parents[2] / "docs"


def _section(view: str) -> str:
    text = (DOCS / "schema.md").read_text()
    match = re.search(rf"^## `{view}`.*?(?=^## |\Z)", text, flags=re.S | re.M)
    assert match, f"docs/schema.md has no section for view {view}"
    return match.group(0)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("store")
    batch = SpanBatch()
    add_request(batch, "a", 0, 100, [("queue_wait", 0, 10), ("generation", 10, 100),
                                     ("prefill", 10, 30, "generation"), ("decode", 30, 100, "generation")],
                attrs={"gen_ai.usage.output_tokens": "8", "tailscope.tenant": "t"})
    write(path, batch)
    return path


@pytest.mark.parametrize("view", PUBLIC_VIEWS)
def test_every_column_of_every_view_is_documented(store: Path, view: str) -> None:
    con = connect(store)
    columns = [d[0] for d in con.execute(f"SELECT * FROM {view} LIMIT 0").description]
    documented = re.findall(r"^\| `([A-Za-z0-9_]+)` \|", _section(view), flags=re.M)
    assert columns == documented


def test_documented_sql_examples_run(store: Path) -> None:
    text = (DOCS / "schema.md").read_text()
    blocks = re.findall(r"```sql\n(.*?)```", text, flags=re.S)
    queries = [q.strip() for block in blocks for q in block.split(";") if q.strip()
               and not all(line.strip().startswith("--") for line in q.strip().splitlines())]
    assert len(queries) == 4
    con = connect(store)
    for query in queries:
        assert con.execute(query).fetchall()
