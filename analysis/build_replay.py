"""Build the optional C replay kernel `analysis/_replay.so` (the FIFO k-server queue of analysis.capacity).

    python -m analysis.build_replay

Without it analysis.capacity replays with its Python loop: the same numbers, about 30 times
slower (a capacity curve over a large range then takes a minute instead of seconds).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

SOURCE = Path(__file__).with_name("_replay.c")


def target() -> Path:
    """Where the built library goes: next to its source."""
    return SOURCE.with_name("_replay.so")


def build(out: Path | None = None, quiet: bool = False) -> Path:
    """Compile the kernel as a plain shared library (loaded with ctypes); return the built file."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()
    out = out or target()
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    cmd = [*cc, "-O2", "-shared", "-fPIC", "-Wall", str(SOURCE), "-o", str(tmp)]
    if not quiet:
        print(" ".join(cmd))
    try:
        subprocess.run(cmd, check=True)
        os.replace(tmp, out)  # a running process keeps its mapped copy; never overwrite in place
    finally:
        tmp.unlink(missing_ok=True)
    return out


if __name__ == "__main__":
    print(f"built {build()}")
    sys.exit(0)
