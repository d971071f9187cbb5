"""The journal: request bodies fsynced before a 200, so segments can be written in large groups behind it.

A group commit has a fixed cost of about 13 ms (Parquet encoders, promotion, fsyncs) whatever its
size, and 8 clients of 512-span bodies keep only ~4,000 spans in flight, so acknowledging only
after the segment left groups of ~2,000 spans and the fixed cost at 6 µs a span
(docs/benchmarks.md). While several clients send, the committer instead appends each
request's bytes to a journal file, fsyncs it and answers; segments are then written from what
accumulated, at most every --journal-ms (or at --segment-spans), and the journal files they cover
are deleted. A receiver killed before that leaves its files behind; the next receiver on the store
replays them (`replay_records`), dropping spans already in segments written since the journal
generation began, so an acknowledged span is stored exactly once.

Files: STORE/.journal/<writer>-<generation>.journal, the writer name as in tracing.store (kind,
host, pid, random). One file per generation (the spans taken into one segment group); a header
with the wall time the generation began, then records of
`<u32 payload length><u32 crc32><u8 kind><u16 peer length><peer><payload>`. A torn tail (killed
mid-append, never acknowledged) ends the file's records.
"""

from __future__ import annotations

import os
import re
import socket
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tracing.store import fsync_path

JOURNAL_DIR = ".journal"
MAGIC = b"TSJ1"
_HEADER = struct.Struct("<4sQ")
_RECORD = struct.Struct("<IIBH")
#: record kinds: an OTLP protobuf body (replayed through the decoder), an Arrow IPC stream of a base table
PROTOBUF, ARROW = 0, 1
_NAME = re.compile(r"^[a-z]+-(?P<host>[^-]+)-(?P<pid>\d+)-[0-9a-f]+-(?P<gen>\d+)\.journal$")


def journal_dir(store: Path) -> Path:
    """The store's journal directory (beside spans/, so no segment glob sees it)."""
    return Path(store) / JOURNAL_DIR


def encode_record(kind: int, peer: str | None, payload: bytes) -> bytes:
    """One record: lengths, a CRC of kind, peer and payload, then the bytes."""
    p = (peer or "").encode()
    crc = zlib.crc32(payload, zlib.crc32(p, kind))
    return _RECORD.pack(len(payload), crc, kind, len(p)) + p + payload


@dataclass(frozen=True)
class Record:
    """One journalled request: kind, the peer to record (protobuf bodies only), the bytes."""

    kind: int
    peer: str | None
    payload: bytes


def journal_started_ns(path: Path) -> int:
    """The wall-clock ns the generation of journal file `path` began (0: no header, nothing acknowledged)."""
    with open(path, "rb") as fh:
        return _started_ns(fh.read(_HEADER.size))


def _started_ns(data: bytes) -> int:
    """The generation start a journal's first bytes record (0: no complete header, killed before it was written)."""
    if len(data) < _HEADER.size or data[:4] != MAGIC:
        return 0
    return int(_HEADER.unpack_from(data)[1])


def read_journal(path: Path) -> tuple[int, list[Record]]:
    """(the generation's start in wall-clock ns, its complete records); a torn or corrupt tail ends them."""
    data = path.read_bytes()
    started_ns = _started_ns(data)
    if not started_ns:
        return 0, []  # killed before the header was written: no record in it was acknowledged
    records: list[Record] = []
    pos = _HEADER.size
    while pos + _RECORD.size <= len(data):
        length, crc, kind, peer_len = _RECORD.unpack_from(data, pos)
        start = pos + _RECORD.size
        end = start + peer_len + length
        if end > len(data):
            break
        peer, payload = data[start:start + peer_len], data[start + peer_len:end]
        if zlib.crc32(payload, zlib.crc32(peer, kind)) != crc or kind not in (PROTOBUF, ARROW):
            break
        records.append(Record(kind, peer.decode() or None, payload))
        pos = end
    return started_ns, records


def host_tag() -> str:
    """This host as tracing.store.SegmentWriter puts it in writer names."""
    return socket.gethostname().replace("-", "").replace(".", "")[:16] or "host"


def pid_alive(pid: int) -> bool:
    """True when process `pid` exists on this host (owned by anyone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def orphaned_journals(store: Path) -> list[Path]:
    """Journal files left by dead receivers on this host (a live receiver's files are its own)."""
    host = host_tag()
    found = []
    for path in sorted(journal_dir(store).glob("*.journal")):
        match = _NAME.match(path.name)
        if match is not None and match["host"] == host and not pid_alive(int(match["pid"])):
            found.append(path)
    return found


class Journal:
    """The append side, used by the committer's journal thread only (not thread-safe by design)."""

    def __init__(self, store: Path, writer: str, *, durable: bool) -> None:
        self.dir = journal_dir(store)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.writer = writer
        self.durable = durable
        self._files: dict[int, BinaryIO] = {}
        self._dropped = -1  # every generation up to this one is in segments: its file is gone for good
        self.bytes_written = 0

    def path(self, gen: int) -> Path:
        """The file of generation `gen`."""
        return self.dir / f"{self.writer}-{gen:06d}.journal"

    def append(self, gen: int, started_ns: int, records: list[bytes]) -> bool:
        """Append `records` to generation `gen`'s file and fsync it; False when that generation is
        already in segments (nothing to do: those requests are durable there)."""
        if gen <= self._dropped:
            return False
        fh = self._files.get(gen)
        if fh is None:
            fh = open(self.path(gen), "ab")  # noqa: SIM115 - kept open until the generation is dropped
            self._files[gen] = fh
            fh.write(_HEADER.pack(MAGIC, started_ns))
            if self.durable:
                fh.flush()
                os.fsync(fh.fileno())
                fsync_path(self.dir)  # the name must survive a crash too
        data = b"".join(records)
        fh.write(data)
        fh.flush()
        if self.durable:
            os.fdatasync(fh.fileno())
        self.bytes_written += len(data)
        return True

    def drop(self, upto_gen: int) -> None:
        """Delete the files of every generation up to `upto_gen` (their spans are in fsynced segments)."""
        if upto_gen <= self._dropped:
            return
        self._dropped = upto_gen
        for gen in [g for g in self._files if g <= upto_gen]:
            self._files.pop(gen).close()
            self.path(gen).unlink(missing_ok=True)

    def close(self) -> None:
        """Close every open file (those not dropped stay on disk for the next start's replay)."""
        for fh in self._files.values():
            fh.close()
        self._files.clear()
