"""tests/samples_cache.py: a shared store is built once for every process of the session, and a hand-out fails
once any user changed it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import samples_cache


def _builder(builds: list[Path]) -> Callable[[Path], list[str]]:
    def build(path: Path) -> list[str]:
        builds.append(path)
        time.sleep(0.2)  # a slow build: the other thread asks meanwhile and must wait for it, not build again
        path.mkdir(parents=True)
        (path / "segment.parquet").write_text("spans")
        return ["a warning"]
    return build


def test_a_store_is_built_once_and_read_by_whoever_asks_later(tmp_path_factory: pytest.TempPathFactory) -> None:
    builds: list[Path] = []
    build = _builder(builds)
    got: list[Path] = []
    tmp_path_factory.getbasetemp()  # made once, before the threads (pytest makes it lazily, and not thread-safely)
    # two threads stand for two workers: each its own key (no memory of the other's), one directory
    threads = [threading.Thread(target=lambda k=k: got.append(samples_cache._shared(
        (Path("test-once"), k), "test-once", build, tmp_path_factory)))
        for k in (True, False)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(builds) == 1 and len(got) == 2 and got[0] == got[1] == builds[0]
    assert samples_cache._warnings[Path("test-once")] == ["a warning"]
    # a later process reads the manifest: the same store, not built again
    assert samples_cache._shared((Path("test-once"), "later"), "test-once", build, tmp_path_factory) == builds[0]
    assert len(builds) == 1


def test_a_changed_store_is_refused_at_the_next_hand_out(tmp_path_factory: pytest.TempPathFactory) -> None:
    builds: list[Path] = []
    store = samples_cache._shared("test-changed", "test-changed", _builder(builds), tmp_path_factory)
    (store / "extra.parquet").write_text("written by a test")
    with pytest.raises(AssertionError, match="a test wrote into the shared store"):
        samples_cache._shared("test-changed", "test-changed", _builder(builds), tmp_path_factory)
    samples_cache._stores.pop("test-changed")
    with pytest.raises(AssertionError, match=r"extra\.parquet"):  # another worker sees it too
        samples_cache._shared("test-changed-2", "test-changed", _builder(builds), tmp_path_factory)
    assert len(builds) == 1
