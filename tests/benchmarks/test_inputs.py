"""benchmarks.inputs: an input is reused only when the running code and parameters built it, and only as built."""

from __future__ import annotations

import argparse
import fcntl
import json
from pathlib import Path

import pytest

from benchmarks import inputs as I
from benchmarks.bench_report import stores
from benchmarks.synthetic import make_store

CALLS: list[dict[str, object]] = []


def build(path: Path, size: int) -> None:
    """A tiny input: `size` bytes in data/blob, one call recorded."""
    CALLS.append({"path": path, "size": size})
    (path / "data").mkdir(parents=True)
    (path / "data" / "blob").write_bytes(b"x" * size)


@pytest.fixture(autouse=True)
def _calls() -> None:
    CALLS.clear()


def test_built_once_then_reused_with_what_runs_added_removed(tmp_path: Path) -> None:
    target = tmp_path / "input"
    assert I.prepare(target, build, size=3) is not None
    assert (target / "data" / "blob").read_bytes() == b"xxx" and len(CALLS) == 1
    assert not list(tmp_path.glob(".input.building-*"))  # built aside, renamed into place
    (target / "requests").mkdir()  # what a benchmark derives from its input: materialized hours, alert state
    (target / "requests" / "hour.parquet").write_bytes(b"derived")
    (target / "data" / "extra").write_bytes(b"derived")
    assert I.prepare(target, build, size=3) is None  # reused: not built again
    assert len(CALLS) == 1
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*")) == [I.STAMP, "data", "data/blob"]


def test_what_runs_added_under_a_kept_directory_stays(tmp_path: Path) -> None:
    """`keep`: a reader of the input may be using what was derived under those directories (bench_cost keeps the
    materialized hours); the rest added is still removed."""
    target = tmp_path / "input"
    I.prepare(target, build, size=3)
    (target / "requests" / "hr=1").mkdir(parents=True)
    (target / "requests" / "hr=1" / "hour.parquet").write_bytes(b"derived")
    (target / "data" / "extra").write_bytes(b"derived")
    assert I.prepare(target, build, keep=("requests",), size=3) is None and len(CALLS) == 1
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*")) == [
        I.STAMP, "data", "data/blob", "requests", "requests/hr=1", "requests/hr=1/hour.parquet"]


def test_other_parameters_rebuild(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "input"
    I.prepare(target, build, size=3)
    I.prepare(target, build, size=5)
    assert [c["size"] for c in CALLS] == [3, 5]
    assert (target / "data" / "blob").read_bytes() == b"xxxxx"
    assert "rebuilding: its params differ ({'size': 3} then, {'size': 5} now)" in capsys.readouterr().err


def test_other_code_rebuilds_naming_the_module(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A stamp written by another version of the builder's module (its source hash differs) is rebuilt."""
    target = tmp_path / "input"
    I.prepare(target, build, size=3)
    stamp = json.loads((target / I.STAMP).read_text())
    stamp["modules"][__name__] = "0" * 64
    stamp["digest"] = "another-version"
    (target / I.STAMP).write_text(json.dumps(stamp))
    assert I.prepare(target, build, size=3) is not None
    assert len(CALLS) == 2
    assert f"rebuilding: the code that built it changed ({__name__})" in capsys.readouterr().err
    stamp = I.read_stamp(target)
    assert stamp is not None and stamp["digest"] == I.fingerprint(build, {"size": 3})["digest"]


def test_a_built_file_changed_or_missing_rebuilds(tmp_path: Path) -> None:
    target = tmp_path / "input"
    I.prepare(target, build, size=3)
    (target / "data" / "blob").write_bytes(b"yyyy")
    I.prepare(target, build, size=3)
    assert len(CALLS) == 2 and (target / "data" / "blob").read_bytes() == b"xxx"
    (target / "data" / "blob").unlink()
    I.prepare(target, build, size=3)
    assert len(CALLS) == 3


def test_a_directory_not_built_by_a_benchmark_is_refused_untouched(tmp_path: Path) -> None:
    target = tmp_path / "someones-store"
    target.mkdir()
    (target / "precious").write_text("keep me")
    with pytest.raises(I.InputError, match=r"someones-store: exists and was not built by a benchmark"):
        I.prepare(target, build, size=3)
    assert (target / "precious").read_text() == "keep me" and not CALLS
    with pytest.raises(I.InputError, match=r"not built by a benchmark \(no \.bench-input\.json\)"):
        I.check(target, build, size=3)


def test_a_failed_build_leaves_nothing_that_looks_built(tmp_path: Path) -> None:
    def broken(path: Path) -> None:
        path.mkdir()
        (path / "half").write_text("half")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        I.prepare(tmp_path / "input", broken)
    assert [p.name for p in tmp_path.iterdir()] == [".input.lock"]  # the run's lock (hold), nothing built


def test_a_second_run_on_the_same_input_stops_in_one_line_before_touching_it(tmp_path: Path) -> None:
    I.prepare(tmp_path / "input", build, size=3)
    other = tmp_path / "input2"
    with open(tmp_path / ".input2.lock", "w") as f:  # another process's lock: flock is per open file
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        for touch in (lambda: I.prepare(other, build, size=3), lambda: I.clear(other),
                      lambda: I.matches(other, build, size=3)):
            with pytest.raises(I.InputError, match=r"input2: in use by another process .*choose another --dir$"):
                touch()
    assert not other.exists() and len(CALLS) == 1
    I.clear(other)  # free again: this process takes the lock
    I.prepare(tmp_path / "input", build, size=3)  # this process's own lock: reused, not refused
    assert len(CALLS) == 1


def test_the_fingerprint_follows_imports_of_this_repository() -> None:
    """The synthetic store's fingerprint covers its generator and the store code it writes through, no more."""
    assert set(I.source_closure("benchmarks.synthetic")) == {
        "benchmarks.synthetic", "tracing.store", "tracing.schema", "tracing.errors", "tracing.settings"}
    described = I.fingerprint(make_store, {"spans": 7000})
    assert described["builder"] == "benchmarks.synthetic.make_store" and described["params"] == {"spans": 7000}
    assert described["libraries"]["pyarrow"] and described["libraries"]["numpy"]


def test_bench_report_stores_never_time_a_materialization_an_earlier_run_did(tmp_path: Path) -> None:
    """`stores()` used to reuse any --dir/store-N as it was, so a second run's materialize_s timed a no-op."""
    from analysis.engine.materialize import materialize

    args = argparse.Namespace(spans="7000", dir=str(tmp_path), store=None)
    [(spans, store)] = list(stores(args))
    assert spans == 7000 and len(materialize(store)) == 2  # two hours built
    stamp = (store / I.STAMP).read_text()
    [(_, again)] = list(stores(args))
    assert again == store and (store / I.STAMP).read_text() == stamp  # reused, not rebuilt
    assert not (store / "requests").exists()
    assert len(materialize(store)) == 2  # the next run builds every hour again


def test_bench_report_refuses_a_store_it_did_not_build(tmp_path: Path) -> None:
    (tmp_path / "store-7000" / "spans").mkdir(parents=True)
    (tmp_path / "store-7000" / "spans" / "old.parquet").write_bytes(b"whatever built it")
    with pytest.raises(I.InputError):
        list(stores(argparse.Namespace(spans="7000", dir=str(tmp_path), store=None)))
