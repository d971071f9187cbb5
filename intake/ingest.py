"""`tailscope ingest`: load trace files into a store, idempotently and all-or-nothing per file.

Accepted: OTLP/JSON lines (the Collector file exporter: one ExportTraceServiceRequest per
line), one pretty-printed OTLP/JSON document, OTLP protobuf (one message, or the file
exporter's 4-byte big-endian length-prefixed stream), and gzip of any of them. A file is
parsed whole before anything is written, so a bad line leaves the store as it was;
`skip_bad` drops bad lines (and rejected spans) and counts them instead. A JSON document
(line) of STREAM_JSON_BYTES or more is decoded span by span (intake.otlp_stream): peak memory
about 4.6x its size instead of about 14x for `json.loads` of the whole (docs/benchmarks.md).
"""

from __future__ import annotations

import gzip
import re
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from intake.engines import normalize
from intake.otlp import DecodeResult, decode_json, decode_protobuf
from intake.otlp_stream import decode_json_stream
from intake.recognition import Recognition, recognise
from tracing import schema as S
from tracing.errors import InputError
from tracing.rows import SpanBatch
from tracing.store import SegmentWriter, init_store, list_hour

_CHUNK_SPANS = 200_000
#: JSON documents (lines) of at least this many bytes are decoded span by span (intake.otlp_stream)
#: rather than parsed whole: json.loads builds about ten times the text in Python objects.
STREAM_JSON_BYTES = 4 << 20
#: Spans per batch while a large document is decoded span by span (about 5 KB of Python objects each).
STREAM_CHUNK_SPANS = 2048
Progress = Callable[[int], None]


@dataclass
class IngestReport:
    """What one ingest did: spans read, stored, already present (deduplicated) and skipped."""

    files: int = 0
    spans_read: int = 0
    spans_written: int = 0
    duplicates: int = 0
    bad_lines: int = 0
    rejected_spans: int = 0
    segments: list[Path] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: spans read and requests recognised among them (intake.recognition)
    recognition: Recognition = field(default_factory=Recognition)


def _open_bytes(path: Path) -> bytes:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise InputError(str(path), 0, f"corrupt gzip data ({exc})") from None
    return raw


def _framed_messages(data: bytes) -> list[bytes] | None:
    """Split a 4-byte big-endian length-prefixed stream, or None if `data` is not one."""
    out: list[bytes] = []
    pos = 0
    while pos < len(data):
        if pos + 4 > len(data):
            return None
        (size,) = struct.unpack_from(">I", data, pos)
        pos += 4
        if size == 0 or pos + size > len(data):
            return None
        out.append(data[pos:pos + size])
        pos += size
    return out or None


class _FileReader:
    """Decodes one file into arrow tables, raising InputError (or counting) on bad input."""

    def __init__(self, path: Path, skip_bad: bool, report: IngestReport, progress: Progress | None):
        self.path = path
        self.skip_bad = skip_bad
        self.report = report
        self.progress = progress
        self.batch = SpanBatch()
        self.tables: list[pa.Table] = []
        self.scale = 1.0

    def _flush(self) -> None:
        if len(self.batch):
            self.tables.append(self.batch.to_table())
            self.batch = SpanBatch()

    def _bad(self, line: int, what: str) -> None:
        if not self.skip_bad:
            raise InputError(str(self.path), line, what)
        self.report.bad_lines += 1
        if len(self.report.problems) < 20:
            self.report.problems.append(f"{self.path}:{line}: {what}")

    def _decode(self, line: int, fn: Callable[[], object]) -> None:
        mark = len(self.batch)
        try:
            result = fn()
        except ValueError as exc:
            # drop whatever the bad unit appended before failing, then stop or count
            self.batch = _truncated(self.batch, mark)
            self._bad(line, str(exc))
            return
        if isinstance(result, DecodeResult):
            self._count(line, result)
        if len(self.batch) >= _CHUNK_SPANS:
            self._flush()

    def _count(self, line: int, result: DecodeResult) -> None:
        if result.rejected:
            self.report.rejected_spans += result.rejected
            if len(self.report.problems) < 20:
                self.report.problems.extend(f"{self.path}:{line}: {e}" for e in result.errors[:2])

    def _decode_json(self, line: int, data: bytes, start: int, end: int) -> None:
        """Decode the JSON document data[start:end]: span by span when it is large, else whole."""
        strict = not self.skip_bad
        if end - start < STREAM_JSON_BYTES:
            self._decode(line, lambda: decode_json(data[start:end], self.batch, strict=strict))
            return
        self._flush()  # this document's spans go to tables of their own, dropped if it turns out bad
        mark = len(self.tables)

        def take(batch: SpanBatch) -> None:
            self.tables.append(batch.to_table())

        try:
            result = decode_json_stream(memoryview(data)[start:end], strict=strict,
                                        chunk_spans=STREAM_CHUNK_SPANS, on_chunk=take)
        except ValueError as exc:
            del self.tables[mark:]
            self._bad(line, str(exc))
            return
        if result is None:  # something only the whole-document parse answers exactly (an error, most often)
            del self.tables[mark:]
            self._decode(line, lambda: decode_json(data[start:end], self.batch, strict=strict))
            return
        self._count(line, result)

    def _advance(self, nbytes: int) -> None:
        if self.progress:
            self.progress(int(nbytes * self.scale))

    def read(self) -> list[pa.Table]:
        data = _open_bytes(self.path)
        self.scale = self.path.stat().st_size / max(1, len(data))  # progress counts bytes on disk
        skip = _LEADING_SPACE.match(data).end()  # type: ignore[union-attr]
        head = data[skip:skip + 1]  # data.lstrip() would copy the whole text
        if head == b"[":
            from intake.engines import read_json_array  # Triton's JSON trace file

            tables = read_json_array(self.path, data, skip_bad=self.skip_bad, report=self.report)
            self.tables.extend(tables)
        elif head == b"{":
            self._read_json(data)
        elif not head:
            pass
        else:
            self._read_protobuf(data)
        self._flush()
        return self.tables

    def _read_json(self, data: bytes) -> None:
        newline = data.find(b"\n")
        if newline >= 0:
            ends = _first_and_last(data, 0, newline)
            if ends[:1] == b"{" and ends[1:] != b"}":
                # one pretty-printed document rather than JSON lines
                self._decode_json(1, data, 0, len(data))
                self._advance(len(data))
                return
        for number, (start, end) in enumerate(_lines(data), start=1):
            self._advance(end - start + 1)
            if _blank(data, start, end):
                continue
            self._decode_json(number, data, start, end)

    def _read_protobuf(self, data: bytes) -> None:
        messages = _framed_messages(data)
        if messages is None:
            self._decode(0, lambda: decode_protobuf(data, self.batch, strict=not self.skip_bad))
            self._advance(len(data))
            return
        for number, message in enumerate(messages, start=1):
            # for framed protobuf "line" is the message number
            self._decode(number, lambda m=message: decode_protobuf(m, self.batch, strict=not self.skip_bad))  # type: ignore[misc]
            self._advance(len(message) + 4)


def _lines(data: bytes) -> Iterator[tuple[int, int]]:
    """(start, end) of each line of `data` (slicing or data.split would copy the text)."""
    start = 0
    while start <= len(data):
        end = data.find(b"\n", start)
        if end < 0:
            end = len(data)
        yield start, end
        start = end + 1


_SPACE = b" \t\n\r\x0b\x0c"  # what bytes.strip removes
_LEADING_SPACE = re.compile(b"[" + re.escape(_SPACE) + b"]*")


def _blank(data: bytes, start: int, end: int) -> bool:
    """True when data[start:end] is only whitespace (as bytes.strip sees it), without copying it."""
    return _LEADING_SPACE.match(data, start, end).end() == end  # type: ignore[union-attr]


def _first_and_last(data: bytes, start: int, end: int) -> bytes:
    """The first and last bytes of data[start:end].strip() (b"" when blank), without copying the line."""
    i = _LEADING_SPACE.match(data, start, end).end()  # type: ignore[union-attr]
    j = end
    while j > i and data[j - 1] in _SPACE:
        j -= 1
    return b"" if i == j else data[i:i + 1] + data[j - 1:j]


def _truncated(batch: SpanBatch, keep: int) -> SpanBatch:
    if len(batch) == keep:
        return batch
    fresh = SpanBatch()
    for name, col in batch._cols.items():
        fresh._cols[name] = col[:keep]
    return fresh


def _existing_keys(store: Path, table: pa.Table) -> set[tuple[str, str]]:
    """(TraceId, SpanId) pairs of `table` that the store already holds."""
    hours = pc.unique(pc.strftime(table.column("Timestamp"), format="dt=%Y-%m-%d/hr=%H")).to_pylist()
    files = [str(f) for h in hours for f in list_hour(store / S.SPANS_DIR / h).files]
    if not files:
        return set()
    import duckdb  # lazy: ingest is not the serving hot path

    con = duckdb.connect()
    try:
        con.register("incoming", table.select(["TraceId", "SpanId"]))
        rows = con.execute(
            "SELECT DISTINCT s.TraceId, s.SpanId FROM read_parquet(?, union_by_name=true) s "
            "JOIN incoming i ON s.TraceId = i.TraceId AND s.SpanId = i.SpanId",
            [files],
        ).fetchall()
    finally:
        con.close()
    return {(t, s) for t, s in rows}


def dedupe(store: Path, table: pa.Table) -> tuple[pa.Table, int]:
    """Drop spans repeated within `table` or already in the store; return (table, dropped)."""
    if table.num_rows == 0:
        return table, 0
    keys = pc.binary_join_element_wise(table.column("TraceId"), table.column("SpanId"), "/")
    seen: set[str] = set()
    existing = {f"{t}/{s}" for t, s in _existing_keys(store, table)}
    mask = []
    for key in keys.to_pylist():
        keep = key not in seen and key not in existing
        seen.add(key)
        mask.append(keep)
    if all(mask):  # nothing to drop: no copy of the table
        return table, 0
    kept = table.filter(pa.array(mask, pa.bool_()))
    return kept, table.num_rows - kept.num_rows


def iter_files(paths: list[Path]) -> Iterator[Path]:
    """Files named directly, and every file below a named directory (sorted)."""
    for path in paths:
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        elif path.exists():
            yield path
        else:
            raise InputError(str(path), 0, "no such file or directory")


def ingest_files(paths: list[Path], store: Path, *, skip_bad: bool = False,
                 progress: Progress | None = None) -> IngestReport:
    """Ingest every file into `store`; each file is committed whole or not at all."""
    init_store(store)
    writer = SegmentWriter(store, kind="ingest", durable=True)
    report = IngestReport()
    stored: list[Path] = []  # files committed so far, named if a later file stops the run
    for path in iter_files(paths):
        try:
            tables = _FileReader(path, skip_bad, report, progress).read()
        except InputError as exc:
            if not stored:
                raise
            names = ", ".join(str(p) for p in stored[:5]) + (f" and {len(stored) - 5} more" if len(stored) > 5 else "")
            raise InputError(exc.source, exc.line,
                             f"{exc.what}; stopped here, after storing {len(stored)} earlier file(s) ({names}); "
                             "fix or move this file and run again (spans already stored are skipped)") from None
        report.files += 1
        stored.append(path)
        if not tables:
            continue
        table = normalize(pa.concat_tables(tables))
        report.spans_read += table.num_rows
        report.recognition.add(recognise(table))
        table, dropped = dedupe(store, table)
        report.duplicates += dropped
        report.segments.extend(writer.write(table))
        report.spans_written += table.num_rows
    return report



__all__ = ["IngestReport", "dedupe", "ingest_files", "iter_files"]
