"""Optional machine parts a test needs: skipped on a developer's machine, a failure in CI.

`make test` installs Debian's chromium and builds the C decoder, so under CI (CI=true) a
missing part means the set-up is broken and the test must fail rather than pass silently.
"""

from __future__ import annotations

import os

import pytest


def need(present: bool, what: str, how: str) -> None:
    """Fail (under CI) or skip (elsewhere) unless `present`; the message says how to get `what`."""
    if present:
        return
    message = f"{what} is missing; {how}"
    if os.environ.get("CI"):
        pytest.fail(f"{message} (CI must have it: `make test` installs it)")
    pytest.skip(message)
