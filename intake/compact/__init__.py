"""Compaction and retention of a segment store (`tailscope compact`, and in the background of `tailscope collect`).

`merge` merges an hour's segments in levels into a few large sorted files, atomically for
readers (tracing.store.list_hour hides merged segments); `retention` removes whole hours,
oldest first. docs/collect.md, "What happens to files", tells the whole story.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path

from intake.compact import retention as R
from intake.compact.merge import Compactor, CompactorBusy, PassResult, Policy

__all__ = ["Compactor", "CompactorBusy", "PassResult", "Policy", "make_compactor", "start_background"]


def make_compactor(store: Path, policy: Policy, keep: R.Retention, *, say: Callable[[str], None],
                   on_removed: Callable[[int], None] | None = None,
                   extra_bytes: Callable[[int], int] | None = None, merge: bool = True) -> Compactor:
    """A compactor of `store` that also applies `keep` at every pass (`on_removed(hour_ns)` after each hour
    removed; `extra_bytes(hour_ns)`: the bytes of an hour's materialized requests, counted toward the size limit)."""
    apply = partial(R.apply, store, keep, on_removed=on_removed, extra_bytes=extra_bytes) if keep.active else None
    return Compactor(store, policy, say=say, retention=apply, retention_text=keep.describe(), merge=merge)


def start_background(compactor: Compactor, every_s: float) -> tuple[threading.Thread, threading.Event]:
    """Run `compactor` pass after pass on a daemon thread; set the event to stop it."""
    stop = threading.Event()
    thread = threading.Thread(target=compactor.run, args=(stop, every_s), name="tailscope-compact", daemon=True)
    thread.start()
    return thread, stop
