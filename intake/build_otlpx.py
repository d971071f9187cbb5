"""Build the optional C extension `intake._otlpx` (columnar OTLP protobuf extraction) in place.

    python -m intake.build_otlpx

Without it `intake.otlp` uses its pure-Python decoder, which stores exactly the same rows
about ten times slower; `tailscope collect` says which one it runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

SOURCE = Path(__file__).with_name("_otlpx.c")


def target() -> Path:
    """Where the built extension goes (next to its source, with this interpreter's suffix)."""
    return SOURCE.with_name("_otlpx" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))


def build(quiet: bool = False) -> Path:
    """Compile the extension with the interpreter's C compiler; return the built file."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()
    out = target()
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    cmd = [*cc, "-O3", "-shared", "-fPIC", "-Wall", f"-I{sysconfig.get_paths()['include']}",
           str(SOURCE), "-o", str(tmp)]
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
