"""The documented SQL views over a segment store: `spans`, `requests`, `stages`.

The request model (what a request is, its critical-path stage columns, TTFT / TPOT,
status, replica) is defined once in analysis.engine.model; this module names the views built
from it. `VIEW_SQL` computes `requests` / `stages` from whatever relation is called
`spans` in the connection (used by per-trace helpers and the dashboard); a connection
from analysis.engine.connect reads materialized hours instead where they are fresh
(analysis.engine.materialize).
"""

from __future__ import annotations

from analysis.engine import model as M
from analysis.mapping.rules import Mapping, project

REQUEST_STAGE_COLUMNS: tuple[str, ...] = M.STAGE_COLUMNS


def _quote(text: str) -> str:
    return M.quote(text)


def spans_sql(source: str, mapping: Mapping | None = None) -> str:
    """SQL of the `spans` view over `source` (a FROM item: read_parquet(...) or a table), with the store's
    `mapping` (analysis.mapping) applied when it has one."""
    return f"SELECT *, TimestampNs + Duration AS EndNs FROM {project(source, mapping)}"


def with_later_columns(scan: str) -> str:
    """A FROM item over `scan` (a read_parquet call) that has every LATER_COLUMNS column even when no file does.

    union_by_name gives NULL where some files lack a column, but no column at all when every file
    does; the typed empty relation supplies it. NULL means "written before the column": readers
    coalesce it to the default (analysis.engine.model.LATER_COLUMNS).
    """
    empty = ", ".join(f"NULL::{typ} AS {name}" for name, typ, _ in M.LATER_COLUMNS)
    return f"(SELECT * FROM {scan} UNION ALL BY NAME SELECT {empty} WHERE false)"


def files_source(files: list[str]) -> str:
    """A FROM item over a fixed list of segment files (one snapshot), older segments included."""
    listed = ", ".join(_quote(f) for f in files)
    return with_later_columns(f"read_parquet([{listed}], union_by_name = true, hive_partitioning = false)")


#: `requests` and `stages` computed from the relation named `spans` (no materialized hours).
VIEW_SQL: dict[str, str] = {
    "requests": M.requests_sql("spans"),
    "stages": M.stages_sql("requests"),
}

#: Macro of a connection from analysis.engine.connect: is a span start (ns) in an hour that is not materialized?
LIVE_HOUR_MACRO = "_tailscope_live_hour"

#: The documented views, for docs and tests.
PUBLIC_VIEWS: tuple[str, ...] = ("spans", "requests", "stages")
