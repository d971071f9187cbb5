"""Optional machine parts a test needs: a failure under `make test`, a skip that says what to install elsewhere.

`make test` (and so CI, through `.ci/run`) sets TAILSCOPE_TEST_STRICT=1: it installs Debian's
chromium and every Python extra, and pip builds the C parts wherever a C compiler is, so a missing
part there means the set-up is broken and the test fails. A plain `pytest` run on a developer's
machine skips instead, and the end of the run lists what was missing and how to get it
(tests/conftest.py). The C parts are optional by design: strict mode requires them only on a
machine that can build them (a C compiler and Python's headers, `c_buildable`); without a
compiler their tests skip, strict or not, and say so.
"""

from __future__ import annotations

import importlib
import os
import shutil
import sysconfig
from pathlib import Path
from types import ModuleType

import pytest

#: The environment variable that turns missing prerequisites into failures (`make test`, `.ci/run`).
STRICT_ENV = "TAILSCOPE_TEST_STRICT"
#: Every skip reason written here starts so; tests/conftest.py gathers them into one list at the end.
MISSING = "missing prerequisite: "
#: How to get chdb (the embedded ClickHouse the ClickHouse SQL is tested in).
CHDB_HOW = "install the dev extras: `.venv/bin/pip install -e '.[all,dev]'` (or `make venv`)"
#: How to get the C parts once a compiler is there.
HOW_TO_BUILD_C = "reinstall with a C compiler present: `.venv/bin/pip install -e '.[all,dev]'` (setup.py builds it)"


def strict() -> bool:
    """Whether a missing prerequisite fails the test (TAILSCOPE_TEST_STRICT=1, as `make test` sets)."""
    return os.environ.get(STRICT_ENV, "") not in ("", "0")


def c_buildable() -> bool:
    """Whether this machine can build the optional C parts: Python's C compiler and its headers are there."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()
    include = sysconfig.get_paths().get("include", "")
    return bool(cc) and shutil.which(cc[0]) is not None and (Path(include) / "Python.h").exists()


def need(present: bool, what: str, how: str) -> None:
    """Fail (strict) or skip (elsewhere) unless `present`; the message says how to get `what`."""
    if present:
        return
    message = f"{what} is missing; {how}"
    if strict():
        pytest.fail(f"{message} ({STRICT_ENV} is set: `make test` installs it, so the set-up is broken)")
    pytest.skip(MISSING + message)


def need_c(present: bool, what: str) -> None:
    """`need` for an optional C part: required in strict mode only where a C compiler can build it."""
    if present:
        return
    if not c_buildable():
        pytest.skip(f"{MISSING}{what} is missing and this machine has no C compiler or no Python headers "
                    "(the C parts are optional); install gcc and the Python headers (Debian: "
                    f"build-essential python3-dev), then {HOW_TO_BUILD_C}")
    need(False, what, HOW_TO_BUILD_C)


def need_module(name: str, how: str) -> ModuleType:
    """Import `name`, or fail (strict) / skip (elsewhere) saying how to install it."""
    try:
        return importlib.import_module(name)
    except ImportError:
        need(False, f"the Python package {name}", how)
        raise  # not reached: need fails or skips
