"""Servers that tests start, stopped even when the run is interrupted.

`spawn` starts a server in its own process group and registers it; the group is killed by `stop`
(the fixture's finalizer), at exit (`atexit`: a Ctrl-C, a failed fixture, a SIGTERM, which this
module turns into SystemExit so finalizers and atexit run), and, on Linux, when the test process
itself dies, even by SIGKILL (the child's parent-death signal, `prctl(PR_SET_PDEATHSIG)`).
`tailscope dashboard` passes the same on to its Streamlit child, so neither outlives the run.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from typing import Any

_LIVE: dict[int, subprocess.Popen[Any]] = {}
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In a child before exec: SIGKILL when the parent dies (Linux; elsewhere nothing)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def spawn(argv: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
    """subprocess.Popen(argv) in a new process group, killed with the test process however it ends."""
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # a SIGTERM to the run: finalizers and atexit still run
        signal.signal(signal.SIGTERM, _on_sigterm)
    proc = subprocess.Popen(argv, start_new_session=True, preexec_fn=die_with_parent, **kwargs)
    _LIVE[proc.pid] = proc
    return proc


def stop(proc: subprocess.Popen[Any], timeout: float = 30) -> None:
    """SIGTERM to the server, then SIGKILL to its whole group if it has not stopped within `timeout` s (or
    left a child behind); unregisters it."""
    try:
        if proc.poll() is None:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        _LIVE.pop(proc.pid, None)


@atexit.register
def _stop_all() -> None:
    for proc in list(_LIVE.values()):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        _LIVE.pop(proc.pid, None)
