"""The segment store: a directory of immutable Parquet segments any number of processes share.

Layout: STORE/spans/dt=YYYY-MM-DD/hr=HH/<writer>-<seq>.parquet. Each segment is written
to a hidden temporary name and `os.replace`d into place, so a reader globbing the store
never sees a half-written file; with `durable=True` the file and its directory are
fsynced before the segment is reported written.

pyarrow (the `store` extra) is imported when a writer is made, so `default_store` and the
store's layout functions work in a serving process installed without it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

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


#: A compacted segment: `c<level>-<id>.parquet`, written by intake.compact; beside it `<stem>.replaces`, its record.
COMPACTED = re.compile(r"^c(?P<level>\d+)-[0-9a-f]+\.parquet$")
#: Directory (in the store) where compaction moves segments it cannot read: never deleted, never read.
QUARANTINE_DIR = "quarantine"
#: The compactor's state (JSON: its policy, retention and last pass), read by `tailscope store`.
COMPACTION_STATE = "compaction.json"
#: Suffix of a compacted segment's record (JSON: the names of the segments it replaces and its digest).
RECORD_SUFFIX = ".replaces"
_DIGEST_MOD = 1 << 128


def name_digest(name: str) -> int:
    """The digest of a segment written by a writer (not by compaction): a 128-bit hash of its name."""
    return int(hashlib.sha256(name.encode()).hexdigest()[:32], 16)


def combine_digests(digests: Iterable[int]) -> int:
    """The digest of a set of segments: the sum of theirs (mod 2**128), so a merge that replaces some
    segments by one holding the same spans (digest = the sum of its inputs') leaves an hour's digest as it was."""
    return sum(digests) % _DIGEST_MOD


def segment_level(name: str) -> int:
    """0 for a segment a writer made, N for one compaction made at level N (`cN-<id>.parquet`)."""
    match = COMPACTED.match(name)
    return int(match["level"]) if match else 0


def read_record(path: Path) -> dict[str, Any] | None:
    """A compacted segment's record (`path` is the segment), or None when it has none (gone meanwhile)."""
    try:
        with open(path.with_suffix(RECORD_SUFFIX), "rb") as fh:
            record = json.loads(fh.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


@dataclass
class HourListing:
    """The segments of one hour partition a reader must read, and each one's digest."""

    directory: Path
    files: list[Path] = field(default_factory=list)
    digests: dict[str, int] = field(default_factory=dict)  # by file name
    replaced: list[str] = field(default_factory=list)  # names present on disk, but merged into a visible segment

    @property
    def digest(self) -> int:
        """The hour's digest: changes when spans are added or removed, not when compaction merges files."""
        return combine_digests(self.digests.values())


def list_hour(directory: Path, records: dict[str, dict[str, Any]] | None = None) -> HourListing:
    """The visible segments of one hour partition (sorted by name) and their digests.

    `records`: a cache of the records read (by the segment's path), for a caller that lists the
    same hour often (the compactor); a record never changes once its segment has its name.

    A compacted segment's record, written and fsynced before the segment got its name, names
    the segments it replaces: those stay on disk for a grace period (readers that listed them
    before the merge may still read them), but no listing returns them. A reader that sees
    the compacted segment therefore never sees its inputs as well, and one that does not see
    it still sees every input: never both, never neither.
    """
    out = HourListing(Path(directory))
    try:  # names only, no per-entry objects: an hour holds thousands of merged segments during their grace
        names = [n for n in os.listdir(directory) if n.endswith(".parquet") and n[0] != "."]
    except FileNotFoundError:
        return out
    prefix = f"{out.directory}{os.sep}"
    replaced: set[str] = set()
    digests: dict[str, int] = {}
    for name in names:
        if name[0] == "c" and name[1].isdigit() and COMPACTED.match(name):
            key = prefix + name
            record = records.get(key) if records is not None else None
            if record is None:
                record = read_record(Path(key))
                if record is not None and records is not None:
                    records[key] = record
            if record is not None:
                replaced.update(record.get("inputs", ()))
                digests[name] = int(record.get("digest", "0"), 16)
    out.replaced = sorted(replaced.intersection(names))
    for name in sorted(set(names).difference(replaced)):
        out.files.append(out.directory / name)
        out.digests[name] = digests[name] if name in digests else name_digest(name)  # hashed when visible
    return out


def hour_dirs(store: Path) -> list[Path]:
    """The hour partitions of the store (STORE/spans/dt=*/hr=*), sorted (oldest first)."""
    spans = Path(store) / S.SPANS_DIR
    out = []
    try:
        days = sorted(e.path for e in os.scandir(spans) if e.name.startswith("dt=") and e.is_dir())
    except FileNotFoundError:
        return []
    for day in days:
        try:
            out.extend(sorted(Path(e.path) for e in os.scandir(day) if e.name.startswith("hr=") and e.is_dir()))
        except FileNotFoundError:
            continue
    return out


HOUR_NS = 3600 * 1_000_000_000


def hour_of_dir(directory: Path) -> int:
    """The hour (ns since the epoch) of a partition directory dt=YYYY-MM-DD/hr=HH."""
    day = datetime.strptime(directory.parent.name.removeprefix("dt="), "%Y-%m-%d").replace(tzinfo=UTC)
    return int(day.timestamp()) * 1_000_000_000 + int(directory.name.removeprefix("hr=")) * HOUR_NS


def hour_dir(store: Path, hour_ns: int) -> Path:
    """STORE/spans/dt=YYYY-MM-DD/hr=HH of an hour (ns since the epoch)."""
    dt = datetime.fromtimestamp(hour_ns // 1_000_000_000, UTC)
    return Path(store) / S.SPANS_DIR / f"dt={dt:%Y-%m-%d}" / f"hr={dt:%H}"


def list_store(store: Path) -> list[HourListing]:
    """Every hour partition's listing (`list_hour`), oldest first."""
    return [list_hour(d) for d in hour_dirs(store)]


def segment_files(store: Path) -> list[Path]:
    """Every committed segment a reader must read (segments merged by compaction excluded), sorted by path."""
    return [f for hour in list_store(store) for f in hour.files]


def fsync_path(path: Path) -> None:
    """fsync a file or directory by its path (a directory: the names created or removed in it become durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Write a small file through a temp name and os.replace, fsynced, so a crash leaves the old or the new file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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
    column, which the receiver pays once per group commit (docs/benchmarks.md)."""
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
