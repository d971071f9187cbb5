"""servers.stop ends a child's own children too, even when the child ignores SIGTERM (tests/servers.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tests import servers

# a parent that starts a grandchild, prints its pid, and ignores SIGTERM (as a server killed mid-start would leave it)
PARENT = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(child.pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # a zombie waiting for its reaper is gone too
        return fh.read().split(") ", 1)[1][0] != "Z"


def _gone(pid: int) -> bool:
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


def test_stop_ends_the_grandchildren() -> None:
    proc = servers.spawn([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    grandchild = int(proc.stdout.readline())
    servers.stop(proc, timeout=2)
    assert proc.returncode is not None and _gone(grandchild)


def test_stop_ends_them_after_the_parent_was_killed_alone() -> None:
    proc = servers.spawn([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    grandchild = int(proc.stdout.readline())
    proc.kill()  # what the tests did: the parent alone
    proc.wait(timeout=30)
    time.sleep(0.5)
    try:
        assert _alive(grandchild)  # the premise: orphaned, still running
    finally:
        servers.stop(proc, timeout=2)
    assert _gone(grandchild)
