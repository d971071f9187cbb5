"""Retention: whole hours of spans removed, oldest first, by age (`--retain`) or by the store's size (`--max-store-gb`).

An hour goes in one step for readers: its partition directory is renamed into STORE/.trash/
(one rename, so a listing sees all of the hour's segments or none of them), then deleted;
`on_removed(hour_ns)` follows (the CLI passes one that removes the hour's materialized
requests, which no reader uses once its spans are gone). The newest hour is never removed by
size, and nothing outside STORE/spans/ and the requests is touched (watch's STORE/alerts stay).
A reader in the middle of a query over a removed hour gets one line saying the store changed.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tracing.store import HOUR_NS, fsync_path, hour_dirs, hour_of_dir

#: Directory (in the store) where a removed hour is renamed before it is deleted.
TRASH_DIR = ".trash"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")


def parse_duration(text: str) -> float:
    """Seconds in a duration such as `90m`, `36h`, `3d`, `2w`; ValueError naming the text otherwise."""
    match = _DURATION.match(text.lower())
    if match is None:
        raise ValueError(f"--retain {text!r}: give a number and a unit (s, m, h, d or w), e.g. 3d or 36h")
    seconds = float(match[1]) * _UNITS[match[2]]
    if seconds <= 0:
        raise ValueError(f"--retain {text!r}: must be positive")
    return seconds


@dataclass(frozen=True)
class Retention:
    """Keep hours that ended less than `retain_s` ago (None: by age, keep all) and at most `max_bytes`
    of spans and materialized requests (None: no size limit)."""

    retain_s: float | None = None
    max_bytes: int | None = None

    @property
    def active(self) -> bool:
        """True when either limit is set."""
        return self.retain_s is not None or self.max_bytes is not None

    def describe(self) -> str:
        """`3d, 20 GB` or `off`: what the store line and `tailscope store` print."""
        parts = []
        if self.retain_s is not None:
            parts.append(f"{self.retain_s / 86400:g}d" if self.retain_s % 86400 == 0 else f"{self.retain_s / 3600:g}h")
        if self.max_bytes is not None:
            parts.append(f"{self.max_bytes / 1e9:g} GB")
        return ", ".join(parts) or "off"


def _tree_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                continue
    return total


def remove_hour(store: Path, directory: Path, on_removed: Callable[[int], None] | None = None) -> None:
    """Remove one hour partition: renamed into STORE/.trash/ (one step for readers), then deleted."""
    hour = hour_of_dir(directory)
    trash = Path(store) / TRASH_DIR
    trash.mkdir(exist_ok=True)
    target = trash / f"{directory.parent.name}-{directory.name}-{uuid.uuid4().hex[:8]}"
    os.replace(directory, target)
    fsync_path(directory.parent)
    shutil.rmtree(target, ignore_errors=True)
    with contextlib.suppress(OSError):
        directory.parent.rmdir()  # the day, once its last hour is gone
    if on_removed is not None:
        on_removed(hour)


def empty_trash(store: Path) -> None:
    """Delete what a killed retention left in STORE/.trash/ (hours already out of every listing)."""
    trash = Path(store) / TRASH_DIR
    if trash.is_dir():
        for entry in trash.iterdir():
            shutil.rmtree(entry, ignore_errors=True)


def apply(store: Path, policy: Retention, now_s: float, *, extra_bytes: Callable[[int], int] | None = None,
          on_removed: Callable[[int], None] | None = None) -> list[int]:
    """Remove the hours `policy` no longer keeps, oldest first; return them (ns since the epoch).

    `extra_bytes(hour_ns)` counts what else the hour holds (its materialized requests) toward `max_bytes`.
    """
    if not policy.active:
        return []
    empty_trash(store)
    dirs = hour_dirs(store)
    removed: list[int] = []
    if policy.retain_s is not None:
        cutoff_ns = (now_s - policy.retain_s) * 1e9
        for directory in list(dirs):
            if hour_of_dir(directory) + HOUR_NS <= cutoff_ns:
                remove_hour(store, directory, on_removed)
                removed.append(hour_of_dir(directory))
                dirs.remove(directory)
    if policy.max_bytes is not None and len(dirs) > 1:
        sizes = [_tree_bytes(d) + (extra_bytes(hour_of_dir(d)) if extra_bytes else 0) for d in dirs]
        total = sum(sizes)
        while total > policy.max_bytes and len(dirs) > 1:
            directory = dirs.pop(0)
            total -= sizes.pop(0)
            remove_hour(store, directory, on_removed)
            removed.append(hour_of_dir(directory))
    return removed
