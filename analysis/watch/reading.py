"""Watch's reading of the store: only the hour partitions (and segments) a range of windows needs."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Final

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from analysis.engine.percentiles import iso, request_facts
from analysis.engine.views import VIEW_SQL, files_source, spans_sql, spill_to_temp
from analysis.mapping.rules import load as load_mapping
from analysis.stats import explain as X
from tracing import schema as S
from tracing.store import list_hour, require_store

HOUR_NS: Final = 3_600_000_000_000
#: Columns of a request row in the watch's buffer.
ROW_COLUMNS: Final = ("trace_id", "span_id", "start_ns", "e2e_ns", "ttft_ns", "tpot_ns", "status", *X.DIMENSIONS,
                      "service", "adjusted_count")


def _ts_range(path: Path) -> tuple[int, int]:
    """(min, max) TimestampNs of a segment from its Parquet footer, cached by path, size and mtime."""
    st = path.stat()
    return _ts_range_cached(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=200_000)
def _ts_range_cached(path: str, _size: int, _mtime_ns: int) -> tuple[int, int]:
    meta = pq.ParquetFile(path).metadata
    lo, hi = None, None
    try:
        col = meta.schema.names.index("TimestampNs")
    except ValueError:
        return (-(2**63), 2**63 - 1)
    for i in range(meta.num_row_groups):
        stats = meta.row_group(i).column(col).statistics
        if stats is None or not stats.has_min_max:
            return (-(2**63), 2**63 - 1)
        lo = stats.min if lo is None else min(lo, stats.min)
        hi = stats.max if hi is None else max(hi, stats.max)
    if lo is None or hi is None:
        return (0, -1)  # no rows
    return (int(lo), int(hi))


def segment_files_between(store: Path, lo_ns: int, hi_ns: int) -> list[Path]:
    """Segments holding spans that start in [lo_ns, hi_ns): lists only the hour partitions of the range.

    Within a partition, a segment is kept only when its TimestampNs range (read once from its
    Parquet footer, then cached) meets the range: a live receiver writes many small segments an
    hour, and a tick must open only those of its window.
    """
    spans = Path(store) / S.SPANS_DIR
    out: list[Path] = []
    hour = (lo_ns // HOUR_NS) * HOUR_NS
    while hour < hi_ns:
        text = iso(hour)
        directory = spans / f"dt={text[:10]}" / f"hr={text[11:13]}"
        if directory.is_dir():
            for path in list_hour(directory).files:
                try:
                    first, last = _ts_range(path)
                except (FileNotFoundError, OSError, pa.ArrowException):  # compacted away meanwhile, or unreadable
                    continue
                if first < hi_ns and last >= lo_ns:
                    out.append(path)
        hour += HOUR_NS
    return out


def open_range(store: Path, lo_ns: int, hi_ns: int, memory_limit: str = "2GB") -> duckdb.DuckDBPyConnection:
    """A connection whose `spans` view holds only spans starting in [lo_ns, hi_ns) (`_ensure_views` adds the rest).

    Reads only the hour partitions of that range, so its cost does not grow with the store's history.
    """
    store = require_store(Path(store)).resolve()
    con = duckdb.connect(":memory:")
    con.execute("SET memory_limit = ?", [memory_limit])
    spill_to_temp(con)
    con.execute("SET enable_progress_bar = false")
    files = [str(f) for f in segment_files_between(store, lo_ns, hi_ns)]
    con.register("_empty_spans_arrow", S.empty_span_table())
    con.execute("CREATE TABLE _empty_spans AS SELECT * FROM _empty_spans_arrow")
    con.unregister("_empty_spans_arrow")
    mapping = load_mapping(store)
    source = spans_sql(files_source(files), mapping) if files else spans_sql("_empty_spans", mapping)
    con.execute(f"CREATE VIEW spans AS SELECT * FROM ({source}) "
                f"WHERE TimestampNs >= {int(lo_ns)} AND TimestampNs < {int(hi_ns)}")
    return con


def _ensure_views(con: duckdb.DuckDBPyConnection) -> None:
    """Define `requests` and the views it needs on a range connection (only when a query needs them:
    binding them costs more than a tick's own work)."""
    for name, sql in VIEW_SQL.items():
        con.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")


def request_source(con: duckdb.DuckDBPyConnection) -> str:
    """The request facts (percentiles.request_facts, with TTFT) of a range connection."""
    try:
        return request_facts(con, with_ttft=True)
    except duckdb.CatalogException:  # traces holding several requests are read through the `requests` view
        _ensure_views(con)
        return request_facts(con, with_ttft=True)


def read_rows(con: duckdb.DuckDBPyConnection, lo_ns: int, hi_ns: int, window_ns: int, delay_ns: int
              ) -> pl.DataFrame:
    """Requests starting in [lo_ns, hi_ns) that ended by their window's end + delay (what a live watch saw)."""
    facts = request_source(con)
    cols = ", ".join(ROW_COLUMNS)
    return con.sql(
        f"SELECT {cols} FROM {facts} WHERE start_ns >= $lo AND start_ns < $hi "
        "AND start_ns + e2e_ns <= (start_ns // $w) * $w + $w + $d ORDER BY start_ns, trace_id",
        params={"lo": lo_ns, "hi": hi_ns, "w": window_ns, "d": delay_ns}).pl()
