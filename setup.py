"""The optional C parts, built by `pip install` when a C compiler is there.

- `intake._otlpx`: the columnwise OTLP decoder. Without it `intake.otlp` uses its pure-Python
  decoder, which stores exactly the same rows, several times slower.
- `analysis._replay`: a plain C library loaded with ctypes, three kernels: the FIFO k-server replay
  of the capacity curve, with fixed or batch-dependent service times (without it `analysis.capacity`
  replays in Python: the same numbers, about ten times slower), the critical-path sweep of one hour's build
  (`analysis.engine.materialize.build_hour`; without it the model's SQL builds the same rows, about
  twice the CPU) and the report's count of each attribute with the built-ins (`count_cells`; without it
  numpy counts the same).

Everything else about the package is in pyproject.toml. Without a compiler (or Python's
headers) the build notes it and goes on.
"""

from __future__ import annotations

import sys
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """build_ext that turns any failure to build an optional part into a one-line note."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler at all: setuptools fails before compiling
            self._note(exc)

    def build_extension(self, ext: Any) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # the compiler or Python.h is missing, or the compile failed
            self._note(exc, ext.name)

    def _note(self, exc: Exception, name: str = "intake._otlpx, analysis._replay") -> None:
        print(f"note: the optional C part {name} was not built ({exc}); tailscope uses its Python code "
              "instead (same results, slower)", file=sys.stderr)


setup(
    ext_modules=[Extension("intake._otlpx", ["intake/_otlpx.c"], optional=True,
                           extra_compile_args=[] if sys.platform == "win32" else ["-O3"]),
                 Extension("analysis._replay", ["analysis/_replay.c"], optional=True,
                           extra_compile_args=[] if sys.platform == "win32" else ["-O2"])],
    cmdclass={"build_ext": OptionalBuildExt},
)
