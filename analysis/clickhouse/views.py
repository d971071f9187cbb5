"""Read-only SQL over `spans`, `requests` and `stages` of an otel_traces table (`tailscope sql --engine clickhouse`)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from analysis.clickhouse.client import DEFAULT_TABLE, Client
from analysis.clickhouse.model import temp_table
from analysis.clickhouse.promotion import source_sql
from analysis.clickhouse.requests import requests_facts
from analysis.clickhouse.server import features
from analysis.engine import model as M
from tracing.errors import QueryError

if TYPE_CHECKING:
    import pyarrow as pa


def query_views(client: Client, sql: str, table: str = DEFAULT_TABLE, *, computed: bool = False,
                limits: dict[str, Any] | None = None, materialized: bool = True) -> pa.Table:
    """Run a read-only query over `spans`, `requests` and `stages` computed from `table`.

    `requests` / `stages` (when the query names them) are computed first into session
    temporary tables (`computed`: `requests` is there already); `spans` is a CTE in front of
    the query; `requests` reads the materialized table where it is current (`requests_facts`,
    unless not `materialized`). The query itself runs with `readonly = 1` (and `limits`, e.g.
    max_execution_time): the server refuses any write, DDL or setting change in it. A query naming OUTFILE is
    refused here: chdb writes `INTO OUTFILE` even read-only.
    """
    words = set(re.findall(r"[A-Za-z_]+", sql.lower()))
    if "outfile" in words:  # the keyword anywhere (comments may sit between INTO and OUTFILE): never a read
        raise QueryError(sql, "INTO OUTFILE writes a file: not in a read-only query")
    if words & {"requests", "stages"} and not computed:
        requests_facts(client, table, materialized=materialized)
    if "stages" in words:
        temp_table(client, "stages", M.stages_sql("requests", features(client).dialect))
    body = sql.strip().rstrip(";")
    spans = f"spans AS {source_sql(table)}"
    m = re.match(r"(?is)^with\s", body)
    full = f"WITH {spans},\n{body[m.end():]}" if m else f"WITH {spans}\n{body}"
    return client.query(full, {**features(client).settings, **(limits or {}), "readonly": 1})

