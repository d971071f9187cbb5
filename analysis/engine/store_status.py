"""How the store is: hours, segments, bytes, spans, oldest and newest span, compaction lag, retention.

Read by `tailscope store` and the dashboard's sidebar. Everything comes from the listing
(tracing.store.list_hour: what a reader reads), the Parquet footers (spans, the TimestampNs
range; skipped with `footers=False`) and STORE/compaction.json, which the compactor
(intake.compact) rewrites after every pass with its policy and retention.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from tracing.store import (
    COMPACTION_STATE,
    HOUR_NS,
    QUARANTINE_DIR,
    hour_of_dir,
    list_store,
    require_store,
    segment_level,
)

#: The compactor's defaults (intake.collect.config.COLLECT), used when it never ran on the store.
DEFAULT_SETTLE_S, DEFAULT_QUIET_S, DEFAULT_TARGET_BYTES = 300.0, 60.0, 64 << 20


@dataclass
class HourStatus:
    """One hour partition."""

    hour_ns: int
    files: int
    uncompacted: int  # segments as a writer made them (level 0)
    hidden: int  # merged segments still on disk for their grace period
    bytes: int
    spans: int | None
    first_ns: int | None
    last_ns: int | None
    pending: bool  # settled, but not yet in its final shape (the compactor's rule: intake.compact.merge)
    settled_s: float = 0.0  # when it settled (s since the epoch): its end + settle, or its last write + quiet if later


@dataclass
class StoreStatus:
    """The whole store."""

    store: str
    hours: list[HourStatus] = field(default_factory=list)
    quarantined: int = 0
    compactor: dict[str, Any] | None = None  # STORE/compaction.json, when a compactor ever ran
    now_s: float = 0.0

    @property
    def files(self) -> int:
        """Segments a reader reads."""
        return sum(h.files for h in self.hours)

    @property
    def bytes(self) -> int:
        """Bytes of the segments a reader reads."""
        return sum(h.bytes for h in self.hours)

    @property
    def spans(self) -> int | None:
        """Spans in the store (None without footers)."""
        counts = [h.spans for h in self.hours]
        return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)

    @property
    def compaction_lag_s(self) -> float:
        """Seconds the oldest settled hour not yet compacted has waited since it settled (0: none waits): since its
        end + settle, or since its last write + quiet when that came later (an old hour written just now, by a
        backfill, has waited only since then)."""
        return max([0.0, *(self.now_s - h.settled_s for h in self.hours if h.pending)])

    def _times(self) -> tuple[float, float]:
        policy = (self.compactor or {}).get("policy", {})
        return float(policy.get("settle_s", DEFAULT_SETTLE_S)), float(policy.get("quiet_s", DEFAULT_QUIET_S))

    def as_dict(self) -> dict[str, Any]:
        """Everything, for `--json`."""
        spans = [h for h in self.hours if h.first_ns is not None]
        return {"store": self.store, "hours": len(self.hours), "files": self.files, "bytes": self.bytes,
                "spans": self.spans, "oldest_span_ns": min((h.first_ns for h in spans), default=None),  # type: ignore[type-var]
                "newest_span_ns": max((h.last_ns for h in spans), default=None),  # type: ignore[type-var]
                "max_files_per_hour": max((h.files for h in self.hours), default=0),
                "compaction_lag_s": round(self.compaction_lag_s, 1),
                "pending_hours": sum(h.pending for h in self.hours), "quarantined": self.quarantined,
                "retention": (self.compactor or {}).get("retention", "off"),
                "last_compaction_ns": (self.compactor or {}).get("last_pass_ns"),
                "per_hour": [asdict(h) for h in self.hours]}


def _footer(path: Path) -> tuple[int, int | None, int | None]:
    """(spans, first TimestampNs, last TimestampNs) from a segment's footer."""
    meta = pq.read_metadata(path)
    col = meta.schema.to_arrow_schema().get_field_index("TimestampNs")
    lo = hi = None
    if col >= 0:
        for i in range(meta.num_row_groups):
            stats = meta.row_group(i).column(col).statistics
            if stats is not None and stats.has_min_max:
                lo = stats.min if lo is None else min(lo, stats.min)
                hi = stats.max if hi is None else max(hi, stats.max)
    return meta.num_rows, lo, hi


def store_status(store: Path | str, *, footers: bool = True, now_s: float | None = None) -> StoreStatus:
    """The store's status now; with `footers`, spans and the span time range too (one footer read per segment)."""
    store = require_store(Path(store))
    out = StoreStatus(str(store), now_s=time.time() if now_s is None else now_s)
    try:
        out.compactor = json.loads((store / COMPACTION_STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        out.compactor = None
    settle, quiet = out._times()
    target = int((out.compactor or {}).get("policy", {}).get("target_bytes", DEFAULT_TARGET_BYTES))
    out.quarantined = sum(len(files) for _, _, files in os.walk(store / QUARANTINE_DIR))
    for listing in list_store(store):
        if not listing.files:
            continue
        hour = hour_of_dir(listing.directory)
        size = spans = 0
        first: int | None = None
        last: int | None = None
        newest_mtime = 0.0
        small = mergeable_raw = 0
        for f in listing.files:
            try:
                st = f.stat()
                n, lo, hi = _footer(f) if footers else (0, None, None)
            except (OSError, ValueError):
                continue  # merged or removed meanwhile, or unreadable (compaction quarantines it)
            size += st.st_size
            small += st.st_size < target // 2
            mergeable_raw += segment_level(f.name) == 0 and st.st_size <= 2 * target
            if segment_level(f.name) == 0:  # a writer's segment (compaction's own are not new spans)
                newest_mtime = max(newest_mtime, st.st_mtime)
            spans += n
            first = lo if first is None or (lo is not None and lo < first) else first
            last = hi if last is None or (hi is not None and hi > last) else last
        raw = sum(segment_level(f.name) == 0 for f in listing.files)
        settled_s = max((hour + HOUR_NS) / 1e9 + settle, newest_mtime + quiet)
        settled = out.now_s >= settled_s  # the compactor's rule: the hour is over by settle, and quiet for quiet
        out.hours.append(HourStatus(hour, len(listing.files), raw, len(listing.replaced), size,
                                    spans if footers else None, first, last,
                                    pending=settled and (small > 1 or mergeable_raw > 0), settled_s=settled_s))
    return out


def summary_line(status: StoreStatus) -> str:
    """One line: hours, segments (most in an hour), bytes, compaction lag, retention."""
    d = status.as_dict()
    spans = f", {d['spans']:,} spans" if d["spans"] is not None else ""
    return (f"{d['hours']} hour(s), {d['files']:,} segment(s) (at most {d['max_files_per_hour']} in an hour), "
            f"{d['bytes'] / 1e6:,.1f} MB{spans}; compaction lag {d['compaction_lag_s']:,.0f} s"
            f" ({d['pending_hours']} settled hour(s) waiting); retention {d['retention']}")
