"""The optional C kernels of analysis (analysis/_replay.c, built by setup.py), loaded once with ctypes.

One library, seven functions: `fifo_replay` and `batch_replay` (the capacity curve's FIFO k-server replay,
with fixed and batch-dependent service times, analysis.capacity), `batch_exceeds` (the batch replay, stopped once
enough latencies are over a limit: the search for the fewest count), `point_stats` (a replayed point's quantiles),
`reactive_replay` (the scale-up), `count_cells` (a count of rows by a key through a table, the report's attribute
pairs, analysis.stats.attributes) and `critical_path` (one hour's critical-path sweep, analysis.engine.materialize).
Their signatures are declared here, beside the loading; without the library (no C compiler at install) the
callers run in Python/SQL.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
from pathlib import Path

_LIB: ctypes.CDLL | None = None
_LIB_TRIED = False


def kernel_path() -> Path:
    """Where `pip install` puts analysis's C kernels: analysis/_replay<extension suffix> (setup.py builds it)."""
    here = Path(__file__).parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        if (here / f"_replay{suffix}").is_file():
            return here / f"_replay{suffix}"
    return here / f"_replay{importlib.machinery.EXTENSION_SUFFIXES[0]}"


def load_kernel(path: Path | str | None = None) -> ctypes.CDLL | None:
    """The C kernels' library (analysis/_replay.so, or `path`), or None when it is not built; the default one is
    loaded once per process."""
    global _LIB, _LIB_TRIED
    if path is None and _LIB_TRIED:
        return _LIB
    file = Path(path) if path is not None else kernel_path()
    lib: ctypes.CDLL | None = None
    if file.is_file():
        lib = ctypes.CDLL(str(file))
        i64, u8 = ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_uint8)
        lib.fifo_replay.argtypes = [i64, i64, ctypes.c_int64, ctypes.c_int64, i64, i64]
        lib.fifo_replay.restype = ctypes.c_int
        if hasattr(lib, "batch_replay"):  # a library built before the batch-dependent replay has not
            f64 = ctypes.POINTER(ctypes.c_double)
            lib.batch_replay.argtypes = [i64, f64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, f64,
                                         ctypes.c_int64, i64, i64, i64, i64]
            lib.batch_replay.restype = ctypes.c_int
        if hasattr(lib, "batch_exceeds"):
            f64 = ctypes.POINTER(ctypes.c_double)
            lib.batch_exceeds.argtypes = [i64, f64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, f64,
                                          ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, i64, i64, i64]
            lib.batch_exceeds.restype = ctypes.c_int
        if hasattr(lib, "point_stats"):
            f64 = ctypes.POINTER(ctypes.c_double)
            lib.point_stats.argtypes = [i64, i64, f64, ctypes.c_int64, i64, ctypes.c_int64, i64, ctypes.c_int64, i64,
                                        f64, i64]
            lib.point_stats.restype = ctypes.c_int64
        if hasattr(lib, "reactive_replay"):
            f64 = ctypes.POINTER(ctypes.c_double)
            lib.reactive_replay.argtypes = [i64, i64, f64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                            ctypes.c_int64, ctypes.c_int64, f64, ctypes.c_int64, i64, i64, i64,
                                            i64, i64, i64]
            lib.reactive_replay.restype = ctypes.c_int
        if hasattr(lib, "count_cells"):
            f64 = ctypes.POINTER(ctypes.c_double)
            lib.count_cells.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, i64, ctypes.c_int64, i64,
                                        f64, i64, f64, ctypes.c_int64]
            lib.count_cells.restype = ctypes.c_int
        if hasattr(lib, "critical_path"):  # a library built before the sweep has the replay only
            lib.critical_path.argtypes = [
                ctypes.c_int64, i64, i64, i64, i64, u8,
                ctypes.c_int64, i64, i64, i64, i64, ctypes.POINTER(ctypes.c_int32), u8, i64, ctypes.c_void_p, u8,
                ctypes.c_int64, u8, u8, i64, i64, i64, u8, i64, u8, i64]
            lib.critical_path.restype = ctypes.c_int
    if path is None:
        _LIB, _LIB_TRIED = lib, True
    return lib
