"""Materialized requests: the request model (analysis.model) written once per hour as Parquet.

Layout: STORE/requests/dt=YYYY-MM-DD/hr=HH/requests-<key>.parquet holds the requests whose
request span starts in that hour, sorted by start_ns. A request reads spans from its own
hour and the hour on each side (the model's rule), so the file is built from the span
segments of those three hours, and <key> is a hash of their names: when a segment lands in
any of them (late spans, a request crossing the hour boundary), the key changes and the
file is stale. The file's key-value metadata (ENGINES_KEY) counts the hour's request spans by
engine, so the report's coverage line reads no span of a materialized hour. A reader
(analysis.connect) uses the file whose key matches the segments it sees and computes
every other hour on the fly, so a query never depends on this having run. Files are
written to a hidden temporary name, fsynced and renamed: readers see the old file or the
new one, never half. Superseded files are removed GRACE_S after they were superseded, so a
connection opened earlier keeps reading its own snapshot meanwhile.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import duckdb

from analysis import model as M
from analysis.views import files_source, spans_sql
from tracing import schema as S
from tracing.store import fsync_path, require_store, segment_files

#: Directory of the materialized requests inside a store.
REQUESTS_DIR = "requests"
#: Materialized request files, relative to the store.
REQUESTS_GLOB = f"{REQUESTS_DIR}/dt=*/hr=*/requests-*.parquet"
#: Seconds a superseded file is kept for connections that still list it.
GRACE_S = 600.0
#: Rows per Parquet row group: a time predicate skips the groups outside it.
ROW_GROUP_ROWS = 16_384
#: zstd level of the request files: level 1 wrote the 2 M-span store's hours in about half the CPU of
#: DuckDB's default (3) for a file 1 % larger (docs/benchmarks.md, issue #11).
ZSTD_LEVEL = 1
#: `collect` builds an hour once the hour after it has ended this long ago (spans arriving later rebuild it).
SETTLE_NS = 5 * 60 * 1_000_000_000

HOUR_NS = M.HOUR_NS
#: Parquet key-value metadata of a request file: JSON {engine: request spans} of the hour's own segments.
ENGINES_KEY = "tailscope.engines"
#: Changes whenever the request model's SQL or the file's layout changes (rules, columns, metadata).
MODEL_FINGERPRINT = hashlib.sha256((M.requests_sql("spans") + ENGINES_KEY).encode()).hexdigest()


def engine_counts_sql(source: str) -> str:
    """Request spans by `tailscope.engine` (engine, n) in `source`: what `tailscope report` says it recognised."""
    return (f"SELECT SpanAttributes['{S.ATTR_ENGINE}'] AS engine, count(*) AS n FROM {source} "
            "WHERE IsRequest AND engine IS NOT NULL GROUP BY engine")


def _hour_of_dir(directory: Path) -> int:
    """The hour (ns since the epoch) of a partition directory dt=YYYY-MM-DD/hr=HH."""
    day = datetime.strptime(directory.parent.name.removeprefix("dt="), "%Y-%m-%d").replace(tzinfo=UTC)
    return int(day.timestamp()) * 1_000_000_000 + int(directory.name.removeprefix("hr=")) * HOUR_NS


def partition_dir(store: Path, hour_ns: int) -> Path:
    """STORE/requests/dt=YYYY-MM-DD/hr=HH of an hour."""
    dt = datetime.fromtimestamp(hour_ns // 1_000_000_000, UTC)
    return Path(store) / REQUESTS_DIR / f"dt={dt:%Y-%m-%d}" / f"hr={dt:%H}"


@dataclass
class Snapshot:
    """The store's segments and materialized request files at one moment, and which hours are fresh."""

    store: Path
    segments: list[Path]
    by_hour: dict[int, list[Path]]
    fresh: dict[int, Path] = field(default_factory=dict)
    stale: list[int] = field(default_factory=list)

    def key(self, hour_ns: int) -> str:
        """Hash of the model's SQL and of the segment names an hour's requests are built from (`hours_read`):
        it changes whenever a segment lands in any of them, and a file built by another version of the
        model is stale too. The one staleness rule: the dashboard keys its own rows of an hour by it."""
        h = hashlib.sha256(MODEL_FINGERPRINT.encode())
        for k in hours_read(hour_ns):
            for f in self.by_hour.get(k, []):
                h.update(f"{k}/{f.name}\n".encode())
        return h.hexdigest()[:24]

    def inputs(self, hours: list[int]) -> list[Path]:
        """The segments needed to compute the requests of `hours` (and to draw one of their traces)."""
        want = {k for h in hours for k in hours_read(h)}
        return [f for h in sorted(want) for f in self.by_hour.get(h, [])]


def hour_of(ns: int) -> int:
    """The hour (ns since the epoch) holding the instant `ns`."""
    return (ns // HOUR_NS) * HOUR_NS


def hours_read(hour_ns: int) -> tuple[int, ...]:
    """The hours whose spans the requests of `hour_ns` read (analysis.model.READ_HOURS: its own and each neighbour)."""
    return tuple(hour_ns + d * HOUR_NS for d in M.READ_HOURS)


def snapshot(store: Path | str) -> Snapshot:
    """List the segments and request files now; an hour is fresh when its file's key matches its segments."""
    store = Path(store)
    segments = segment_files(store)
    by_hour: dict[int, list[Path]] = {}
    for f in segments:
        by_hour.setdefault(_hour_of_dir(f.parent), []).append(f)
    snap = Snapshot(store, segments, by_hour)
    built: dict[int, set[str]] = {}
    for f in store.glob(REQUESTS_GLOB):
        built.setdefault(_hour_of_dir(f.parent), set()).add(f.name)
    for hour in sorted(by_hour):
        name = f"requests-{snap.key(hour)}.parquet"
        if name in built.get(hour, set()):
            snap.fresh[hour] = partition_dir(store, hour) / name
        else:
            snap.stale.append(hour)
    return snap


def stored_source(files: list[Path] | list[str]) -> str:
    """A FROM item reading materialized request files (the `requests` columns)."""
    listed = ", ".join(M.quote(str(f)) for f in files)
    return f"read_parquet([{listed}], hive_partitioning = false)"


def hour_where(hours: list[int]) -> str:
    """SQL condition on span columns: the span starts in one of `hours`."""
    if not hours:
        return "FALSE"
    runs: list[list[int]] = []
    for h in sorted(set(hours)):
        if runs and runs[-1][1] == h:
            runs[-1][1] = h + HOUR_NS
        else:
            runs.append([h, h + HOUR_NS])
    return "(" + " OR ".join(f"(TimestampNs >= {a} AND TimestampNs < {b})" for a, b in runs) + ")"


def hour_requests_sql(con: duckdb.DuckDBPyConnection, snap: Snapshot, hour_ns: int) -> str:
    """SQL of the `requests` rows of one hour, read from the segments of `snap.inputs([hour_ns])`: what
    `build_hour` writes, and what a reader keeping its own copy of a stale hour computes."""
    files = [str(f) for f in snap.inputs([hour_ns])]
    if not files:
        raise ValueError(f"no segment holds spans of the hour at {hour_ns} or its neighbours")
    source = f"({spans_sql(files_source(files))})"
    where = hour_where([hour_ns])
    # the stage spans that can overlap this hour's requests: a literal bound skips most of the next hour
    # (the model's own bounds on the stage spans, `< max(request end)` and `end > min(request start)`, as literals)
    lo, hi = con.execute(f"SELECT min(TimestampNs), max(TimestampNs + Duration) FROM {source} "
                         f"WHERE IsRequest AND {where}").fetchone() or (None, None)
    bound = (f"TimestampNs >= {min(hours_read(hour_ns))} AND TimestampNs < {hi} AND TimestampNs + Duration > {lo}"
             if hi is not None else "FALSE")
    return M.requests_sql(source, request_where=where, span_where=bound)


def build_hour(snap: Snapshot, hour_ns: int, con: duckdb.DuckDBPyConnection | None = None, *,
               threads: int | None = None, memory_limit: str = "4GB") -> Path:
    """Compute and write the requests of one hour; return the file. Crash-safe (temp, fsync, rename)."""
    own = con is None
    if con is None:
        con = duckdb.connect(":memory:")
        if threads:
            con.execute(f"SET threads = {int(threads)}")
        con.execute("SET memory_limit = ?", [memory_limit])
        con.execute("SET preserve_insertion_order = false")
        con.execute("SET enable_progress_bar = false")
    directory = partition_dir(snap.store, hour_ns)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"requests-{snap.key(hour_ns)}.parquet"
    tmp = directory / f".{final.name}.{uuid.uuid4().hex[:8]}.tmp"
    sql = hour_requests_sql(con, snap, hour_ns)
    mine = snap.by_hour.get(hour_ns, [])  # the hour's own segments: its spans, for the recognition counts
    engines = dict(con.execute(engine_counts_sql(files_source([str(f) for f in mine]))).fetchall()) if mine else {}
    meta = M.quote(json.dumps({str(k): int(v) for k, v in sorted(engines.items())}))
    try:
        con.execute(f"COPY (SELECT * FROM ({sql}) ORDER BY start_ns, trace_id, span_id) TO '{tmp}' "
                    f"(FORMAT parquet, COMPRESSION zstd, COMPRESSION_LEVEL {ZSTD_LEVEL}, "
                    f"ROW_GROUP_SIZE {ROW_GROUP_ROWS}, KV_METADATA {{'{ENGINES_KEY}': {meta}}})")
        fsync_path(tmp)
        os.replace(tmp, final)
        fsync_path(directory)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        if own:
            con.close()
    _sweep(directory, keep=final)
    return final


def _sweep(directory: Path, keep: Path) -> None:
    """Remove superseded request files GRACE_S after they were superseded, and abandoned temporaries.

    A superseded file gets a marker (.<name>.superseded) the first time a sweep sees it: its
    grace runs from then, not from when it was written, so a reader that listed it just
    before (a dashboard open for hours) keeps it for GRACE_S.
    """
    cutoff = time.time() - GRACE_S
    for f in directory.iterdir():
        try:
            if f == keep:
                continue
            if f.name.startswith("requests-") and f.suffix == ".parquet":
                marker = directory / f".{f.name}.superseded"
                if not marker.exists():
                    marker.touch()
                if marker.stat().st_mtime <= time.time() - GRACE_S:
                    f.unlink()
                    marker.unlink()
            elif f.name.endswith(".superseded"):
                if not (directory / f.name[1:].removesuffix(".superseded")).exists():
                    f.unlink()  # its file is gone
            elif f.name.startswith(".requests-") and f.stat().st_mtime < cutoff:
                f.unlink()  # a crashed writer's temporary
        except FileNotFoundError:
            pass


def materialize(store: Path | str, *, settled_before_ns: int | None = None, threads: int | None = None,
                memory_limit: str = "4GB", progress: Callable[[int, Path], None] | None = None) -> list[Path]:
    """Build the request file of every stale hour; return the files written.

    With `settled_before_ns`, only hours whose next hour ended by then (the segments an hour
    reads no longer change), as `tailscope collect` does while spans arrive (with one thread,
    so the receiver keeps the other cores).
    """
    store = require_store(Path(store))
    snap = snapshot(store)
    written = []
    for hour in snap.stale:
        if settled_before_ns is not None and hour + 2 * HOUR_NS > settled_before_ns:
            continue
        path = build_hour(snap, hour, threads=threads, memory_limit=memory_limit)
        written.append(path)
        if progress is not None:
            progress(hour, path)
    return written
