"""Child processes that start their own children (examples.serve spawns one process per replica), started in a
process group of their own and stopped as a group: every descendant ends with the test, pass or fail, even when
the parent died first or ignores the signal."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Sequence
from typing import Any


def start_group(args: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
    """`subprocess.Popen(args, **popen)` as the leader of a new session (its process group holds its children)."""
    return subprocess.Popen(list(args), start_new_session=True, **popen)


def stop_group(proc: subprocess.Popen[Any], timeout: float = 60.0) -> None:
    """SIGTERM to the process's whole group, wait up to `timeout` s for the leader, then SIGKILL whatever of the
    group is left (the leader's children too: a leader killed alone would leave them running)."""
    _signal_group(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=timeout)
    _signal_group(proc.pid, signal.SIGKILL)
    proc.wait(timeout=timeout)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group is gone already
        os.killpg(pgid, sig)
