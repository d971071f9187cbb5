"""Startup clean-up and replay: temp segment files and journals left by receivers that died (kill -9, a crash).

A segment is written to `.<name>.<hex>.tmp` and renamed into place; a writer killed before the
rename leaves the hidden file behind (often 0 bytes), which readers ignore but nothing removed.
A temp file is removed only when it names this host and a process id that is no longer alive,
so a live writer's file (this receiver's, an ingest running beside it) is never touched.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc

from intake.collect.commit import RecentKeys
from intake.collect.journal import (
    PROTOBUF,
    host_tag,
    journal_dir,
    journal_started_ns,
    orphaned_journals,
    pid_alive,
    read_journal,
)
from intake.otlp import decode_protobuf_base
from intake.peer import with_peer
from tracing import schema as S
from tracing.store import SegmentWriter, fsync_path

#: seconds subtracted from a journal generation's start when looking for segments that may hold its spans
_MTIME_SLACK_S = 2.0

#: `.<kind>-<host>-<pid>-<id>-<seq>.parquet.<hex>.tmp`, as tracing.store.SegmentWriter names them.
_TEMP = re.compile(r"^\.[a-z]+-(?P<host>[^-]+)-(?P<pid>\d+)-[0-9a-f]+-\d+\.parquet\.[0-9a-f]+\.tmp$")


def remove_dead_temp_files(store: Path) -> list[Path]:
    """Remove temp segment files of dead writers on this host; return the paths removed."""
    host = host_tag()
    removed = []
    for path in (Path(store) / S.SPANS_DIR).glob("dt=*/hr=*/.*.tmp"):
        match = _TEMP.match(path.name)
        if match is None or match["host"] != host or pid_alive(int(match["pid"])):
            continue
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        removed.append(path)
    return removed


@dataclass(frozen=True)
class Replayed:
    """What the startup replay of dead receivers' journals did."""

    files: int
    spans: int  # spans decoded from acknowledged records
    stored: int  # of those, spans written now (the rest were already in segments)


def replay_journals(store: Path, writer: SegmentWriter, keys: RecentKeys,
                    prepare: Callable[[pa.Table], pa.Table]) -> Replayed:
    """Store the spans of journals left by dead receivers (intake/collect/journal.py), then delete them.

    A journalled request was answered 200, but a receiver killed before its segment was written leaves
    the spans only there. Spans already in a segment (the segment was written, the journal file not yet
    deleted) are those of segments written since the generation began: their keys are read and dropped
    here whatever the dedupe settings, so each acknowledged span ends up stored exactly once. One file
    (one segment group of the dead receiver) is decoded, written and deleted at a time, so the replay
    holds no more than the dead receiver's largest group. Killed during the replay, the next start
    replays the files left with the same rule.
    """
    paths = orphaned_journals(store)
    if not paths:
        return Replayed(0, 0, 0)
    starts = [started for started in map(journal_started_ns, paths) if started]
    cutoff = min(starts, default=time.time_ns()) / 1e9 - _MTIME_SLACK_S  # coarse file clocks: a little earlier
    known = RecentKeys(capacity=1 << 62)
    known.load(store, max_age_s=max(0.0, time.time() - cutoff))
    spans = stored = 0
    for path in paths:
        _, records = read_journal(path)
        tables = [with_peer(decode_protobuf_base(r.payload)[0], r.peer) if r.kind == PROTOBUF
                  else pa.ipc.open_stream(r.payload).read_all() for r in records]
        n = sum(t.num_rows for t in tables)
        if n:
            spans += n
            table = prepare(pa.concat_tables(tables))
            del tables
            if table.schema != S.SPAN_SCHEMA:
                table = table.select(list(S.COLUMN_NAMES)).cast(S.SPAN_SCHEMA)
            table, _ = known.filter(table)
            table, found = keys.filter(table)
            if table.num_rows:
                writer.write(table.combine_chunks())  # fsynced (durable) before the file goes
            keys.add(found)
            known.add(found)
            stored += table.num_rows
        path.unlink(missing_ok=True)
    fsync_path(journal_dir(store))
    return Replayed(len(paths), spans, stored)
