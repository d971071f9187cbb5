"""A benchmark killed mid-run stops what it started: `benchmarks.exit_on_termination`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: a benchmark's shape: it starts a child process in its own session and stops it in `finally`
SCRIPT = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    from benchmarks import exit_on_termination
    exit_on_termination()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True,
                             stdout=subprocess.DEVNULL)
    try:
        print(child.pid, flush=True)
        time.sleep(120)
    finally:
        os.killpg(child.pid, signal.SIGTERM)
        child.wait()
        print("stopped", flush=True)
""")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_killed_benchmark_runs_its_finally_and_stops_its_child(sig: signal.Signals) -> None:
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig
    assert out == "stopped\n"
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)
