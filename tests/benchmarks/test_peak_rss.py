"""bench_report's peak RSS is the measured process's own, not its parent's (Linux keeps ru_maxrss across exec)."""

from __future__ import annotations

import subprocess
import sys

from benchmarks.bench_report import peak_rss_mib


def test_a_child_reports_its_own_peak_not_the_parents() -> None:
    """A child started while this process holds 512 MiB more reports its own peak: under the 512 MiB it never held."""
    ballast = bytearray(512 << 20)
    ballast[:: 4096] = b"x" * len(range(0, len(ballast), 4096))  # touch every page: resident
    assert peak_rss_mib() >= 512
    child = subprocess.run([sys.executable, "-c", "from benchmarks.bench_report import peak_rss_mib; "
                            "print(peak_rss_mib())"], capture_output=True, text=True, check=True)
    del ballast
    assert 0 < float(child.stdout) < 512
