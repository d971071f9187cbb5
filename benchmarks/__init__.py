"""Benchmarks: scripts that print figures and ratios against an anchor measured in the same run."""

from __future__ import annotations

import signal
import sys
from types import FrameType


def exit_on_termination() -> None:
    """Turn SIGTERM and SIGHUP into SystemExit, so a benchmark killed mid-run still runs its `finally` blocks and
    stops the servers and browsers it started instead of leaving them behind. Call it from the main thread."""

    def _exit(signum: int, _frame: FrameType | None) -> None:
        sys.exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit)
