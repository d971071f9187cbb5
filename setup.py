"""The optional C decoder `intake._otlpx`, built by `pip install` when a C compiler is there.

Everything else about the package is in pyproject.toml. Without a compiler (or Python's
headers) the build notes it and goes on: `intake.otlp` then uses its pure-Python decoder,
which stores exactly the same rows, several times slower.
"""

from __future__ import annotations

import sys
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """build_ext that turns any failure to build the decoder into a one-line note."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler at all: setuptools fails before compiling
            self._note(exc)

    def build_extension(self, ext: Any) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # the compiler or Python.h is missing, or the compile failed
            self._note(exc)

    def _note(self, exc: Exception) -> None:
        print(f"note: the optional C decoder intake._otlpx was not built ({exc}); "
              "tailscope uses its Python decoder", file=sys.stderr)


setup(
    ext_modules=[Extension("intake._otlpx", ["intake/_otlpx.c"], optional=True,
                           extra_compile_args=[] if sys.platform == "win32" else ["-O3"])],
    cmdclass={"build_ext": OptionalBuildExt},
)
