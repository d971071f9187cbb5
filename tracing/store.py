"""The segment store: a directory of immutable Parquet segments any number of processes share.

Layout: STORE/spans/dt=YYYY-MM-DD/hr=HH/<writer>-<seq>.parquet. Each segment is written
to a hidden temporary name and `os.replace`d into place, so a reader globbing the store
never sees a half-written file; with `durable=True` the file and its directory are
fsynced before the segment is reported written.

pyarrow (the `store` extra) is imported when a writer is made, so `default_store` and the
store's layout functions work in a serving process installed without it.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from tracing import schema as S
from tracing.errors import MissingExtra, StoreError

if TYPE_CHECKING:
    import pyarrow as pa
from tracing.settings import SERVING

#: Environment variable naming the default store directory (owned by the SERVING settings table).
ENV_STORE: str = SERVING.store.env or ""


def default_store() -> Path:
    """The store used when none is named: $TAILSCOPE_STORE, else ~/.local/share/tailscope/store."""
    return SERVING.store.resolve()


def init_store(store: Path) -> Path:
    """Create the store directory (and its marker file) if needed; return it."""
    store = Path(store)
    marker = store / S.STORE_MARKER
    if store.exists() and not store.is_dir():
        raise StoreError(f"{store}: exists and is not a directory; name a directory for the store")
    (store / S.SPANS_DIR).mkdir(parents=True, exist_ok=True)
    if not marker.exists():
        tmp = store / f".{S.STORE_MARKER}.{uuid.uuid4().hex}.tmp"
        tmp.write_text(json.dumps({"format": "tailscope-segments", "version": S.STORE_FORMAT_VERSION}))
        os.replace(tmp, marker)
    return store


def require_store(store: Path) -> Path:
    """Check that `store` is a tailscope store and return it; raise StoreError otherwise."""
    store = Path(store)
    if not store.is_dir():
        raise StoreError(f"{store}: no store there; create one with `tailscope ingest FILE --store {store}`")
    if not (store / S.STORE_MARKER).exists() and not (store / S.SPANS_DIR).is_dir():
        raise StoreError(f"{store}: not a tailscope store (no {S.STORE_MARKER} or {S.SPANS_DIR}/ inside)")
    return store


def segment_files(store: Path) -> list[Path]:
    """Every committed segment of the store, sorted by path."""
    return sorted(Path(store).glob(S.SEGMENT_GLOB))


def fsync_path(path: Path) -> None:
    """fsync a file or directory by its path (a directory: the names created or removed in it become durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def require_pyarrow(what: str) -> None:
    """Raise MissingExtra (one line naming the `store` extra) unless pyarrow can be imported."""
    try:
        import pyarrow  # noqa: F401
    except ModuleNotFoundError as exc:
        raise MissingExtra(what, exc.name or "pyarrow", "store") from None


#: columns without min/max statistics in a segment's footer: random ids, free text and nested
#: attribute maps, whose ranges no query can prune by (the time, stage, replica... columns keep theirs)
NO_STATISTICS = frozenset({"TraceId", "SpanId", "ParentSpanId", "TraceState", "StatusMessage",
                           "ResourceAttributes", "SpanAttributes", "Events", "Links"})
#: columns written without dictionary encoding: almost every value differs within a segment
NO_DICTIONARY = frozenset({"SpanId", "ParentSpanId", "Timestamp", "TimestampNs", "Duration", "TtftNs"})
_write_options: dict[str, list[str]] = {}


def write_options() -> dict[str, list[str]]:
    """`pq.write_table` column options for SPAN_SCHEMA segments (Parquet leaf paths, built once):
    statistics and dictionaries only where they pay. A segment's encoding has a fixed cost per leaf
    column, which the receiver pays once per group commit (docs/benchmarks.md, issue #13)."""
    if not _write_options:
        import io

        import pyarrow.parquet as pq

        buf = io.BytesIO()
        pq.write_table(S.empty_span_table(), buf)
        schema = pq.ParquetFile(buf).schema
        paths = [schema.column(i).path for i in range(len(schema))]
        _write_options["write_statistics"] = [p for p in paths if p.split(".")[0] not in NO_STATISTICS]
        _write_options["use_dictionary"] = [p for p in paths if p not in NO_DICTIONARY]
    return _write_options


class SegmentWriter:
    """Writes span tables into a store as immutable segments, one per (day, hour) partition.

    Thread-safe. `writer` names this writer in segment file names (default: kind, host,
    pid and a random suffix), so writers never collide without coordinating.
    """

    def __init__(self, store: Path, *, kind: str = "w", durable: bool = False,
                 writer: str | None = None, compression: str = "zstd") -> None:
        require_pyarrow("the segment store")
        self.store = init_store(Path(store))
        self.durable = durable
        self.compression = compression
        host = socket.gethostname().replace("-", "").replace(".", "")[:16] or "host"
        self.writer = writer or f"{kind}-{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._seq = 0
        self._lock = threading.Lock()
        self.segments_written = 0
        self.spans_written = 0

    def _next_name(self) -> str:
        with self._lock:
            self._seq += 1
            return f"{self.writer}-{self._seq:06d}.parquet"

    def write(self, table: pa.Table) -> list[Path]:
        """Write `table` (in SPAN_SCHEMA) as one segment per hour partition; return their paths."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if table.num_rows == 0:
            return []
        if table.schema != S.SPAN_SCHEMA:
            table = table.select(list(S.COLUMN_NAMES)).cast(S.SPAN_SCHEMA)
        hours = pc.floor_temporal(table.column("Timestamp"), unit="hour")
        written: list[Path] = []
        unique_hours = pc.unique(hours).to_pylist()
        for hour in sorted(unique_hours):
            part = table if len(unique_hours) == 1 else table.filter(pc.equal(hours, pa.scalar(hour, hours.type)))
            written.append(self._write_partition(part, hour))
        return written

    def _write_partition(self, table: pa.Table, hour: datetime) -> Path:
        import pyarrow.parquet as pq

        hour = hour.astimezone(UTC)
        directory = self.store / S.SPANS_DIR / f"dt={hour:%Y-%m-%d}" / f"hr={hour:%H}"
        directory.mkdir(parents=True, exist_ok=True)
        final = directory / self._next_name()
        tmp = directory / f".{final.name}.{uuid.uuid4().hex[:6]}.tmp"
        try:
            with open(tmp, "wb") as fh:
                pq.write_table(table, fh, compression=self.compression, **write_options())
                if self.durable:
                    fh.flush()
                    os.fsync(fh.fileno())
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        if self.durable:
            fsync_path(directory)
        with self._lock:
            self.segments_written += 1
            self.spans_written += table.num_rows
        return final
