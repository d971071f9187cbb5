"""Startup clean-up: temporary segment files left by writers that died mid-write (kill -9, a crash).

A segment is written to `.<name>.<hex>.tmp` and renamed into place; a writer killed before the
rename leaves the hidden file behind (often 0 bytes), which readers ignore but nothing removed.
A temp file is removed only when it names this host and a process id that is no longer alive,
so a live writer's file (this receiver's, an ingest running beside it) is never touched.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

from tracing import schema as S

#: `.<kind>-<host>-<pid>-<id>-<seq>.parquet.<hex>.tmp`, as tracing.store.SegmentWriter names them.
_TEMP = re.compile(r"^\.[a-z]+-(?P<host>[^-]+)-(?P<pid>\d+)-[0-9a-f]+-\d+\.parquet\.[0-9a-f]+\.tmp$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def remove_dead_temp_files(store: Path) -> list[Path]:
    """Remove temp segment files of dead writers on this host; return the paths removed."""
    host = socket.gethostname().replace("-", "").replace(".", "")[:16] or "host"
    removed = []
    for path in (Path(store) / S.SPANS_DIR).glob("dt=*/hr=*/.*.tmp"):
        match = _TEMP.match(path.name)
        if match is None or match["host"] != host or _alive(int(match["pid"])):
            continue
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        removed.append(path)
    return removed
