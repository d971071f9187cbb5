"""Build the optional C extension `tracing._otlpx` (columnar OTLP protobuf extraction) in place.

    python -m tracing.build_otlpx

Without it `tracing.otlp` uses its pure-Python decoder, which stores exactly the same rows
about ten times slower; `tailscope collect` says which one it runs.
"""

from __future__ import annotations

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
    cmd = [*cc, "-O2", "-shared", "-fPIC", "-Wall", f"-I{sysconfig.get_paths()['include']}",
           str(SOURCE), "-o", str(out)]
    if not quiet:
        print(" ".join(cmd))
    subprocess.run(cmd, check=True)
    return out


if __name__ == "__main__":
    print(f"built {build()}")
    sys.exit(0)
