"""tests/needs.py: a missing prerequisite fails under TAILSCOPE_TEST_STRICT=1 (`make test`) and skips with what to
install elsewhere; a missing C part fails only where a C compiler could have built it."""

from __future__ import annotations

import pytest

from tests import needs


def test_present_passes_in_both_modes(monkeypatch: pytest.MonkeyPatch) -> None:
    for value in ("1", ""):
        monkeypatch.setenv(needs.STRICT_ENV, value)
        needs.need(True, "x", "y")
        needs.need_c(True, "x")


def test_missing_fails_when_strict_and_skips_saying_how_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(needs.STRICT_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="chromium is missing; run `make browser-deps`"):
        needs.need(False, "chromium", "run `make browser-deps`")
    monkeypatch.setenv(needs.STRICT_ENV, "0")
    with pytest.raises(pytest.skip.Exception, match=f"^{needs.MISSING}chromium is missing; run `make browser-deps`"):
        needs.need(False, "chromium", "run `make browser-deps`")
    monkeypatch.delenv(needs.STRICT_ENV)
    with pytest.raises(pytest.skip.Exception):
        needs.need(False, "chromium", "run `make browser-deps`")


def test_a_missing_c_part_fails_only_where_a_compiler_could_build_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(needs.STRICT_ENV, "1")
    monkeypatch.setattr(needs, "c_buildable", lambda: True)
    with pytest.raises(pytest.fail.Exception, match="the C decoder is missing; reinstall"):
        needs.need_c(False, "the C decoder")
    monkeypatch.setattr(needs, "c_buildable", lambda: False)
    with pytest.raises(pytest.skip.Exception, match=r"no C compiler .* install gcc"):
        needs.need_c(False, "the C decoder")


def test_a_missing_module_is_a_prerequisite(monkeypatch: pytest.MonkeyPatch) -> None:
    assert needs.need_module("json", "-").dumps([]) == "[]"
    monkeypatch.setenv(needs.STRICT_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="no_such_package_here is missing; pip install it"):
        needs.need_module("no_such_package_here", "pip install it")
