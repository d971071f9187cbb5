"""Stores several test files build alike, built once per test process (each xdist worker has its own): committed
samples ingested with the same options (about 2 CPU-seconds each, and a dozen files did it again) and the fixed
synthetic stores of `built`.

Every hand-out is read-only and checks that no earlier user changed a file of the store; `copy` gives a test
that writes its own copy. A test of ingestion itself keeps ingesting.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

#: (sample, through the CLI) or a `built` name -> the store, and its files' (path, size, mtime) when it was built
_stores: dict[object, tuple[Path, list[tuple[str, int, int]]]] = {}
_warnings: dict[Path, list[str]] = {}


def _files(store: Path) -> list[tuple[str, int, int]]:
    """Every file of the store with its size and modification time: what a writer would change."""
    return sorted((str(p.relative_to(store)), (st := p.stat()).st_size, st.st_mtime_ns)
                  for p in store.rglob("*") if p.is_file())


def store(sample: Path, factory: pytest.TempPathFactory, *, cli: bool = False) -> Path:
    """The store of `sample`, ingested on first use by `intake.ingest.ingest_files` or, with `cli`, by
    `tailscope ingest --quiet` (which also materializes the hours). Read it only; `copy` for a store to write."""
    key = (sample.resolve(), cli)
    if key not in _stores:
        path = factory.mktemp("sample-" + sample.name.split(".")[0] + ("-cli" if cli else "")) / "store"
        if cli:
            from typer.testing import CliRunner

            from tailscope.cli import app
            from tests.intake.test_engines_clean_input import engine_warnings

            with engine_warnings() as warned:
                result = CliRunner().invoke(app, ["ingest", "--quiet", "--store", str(path), str(sample)])
            assert result.exit_code == 0, result.output
            _warnings[key[0]] = list(warned)
        else:
            from intake.ingest import ingest_files

            ingest_files([sample], path)
        _stores[key] = (path, _files(path))
    return _unchanged(key)


def built(name: str, build: Callable[[Path], object], factory: pytest.TempPathFactory) -> Path:
    """The store `build(path)` writes (a deterministic builder, one per `name`), built on first use; read only."""
    if name not in _stores:
        path = factory.mktemp(name) / "store"
        build(path)
        _stores[name] = (path, _files(path))
    return _unchanged(name)


def _unchanged(key: object) -> Path:
    """The shared store of `key`, after checking that its files are those it was built with."""
    path, files = _stores[key]
    now = _files(path)
    changed = sorted({f[0] for f in set(now) ^ set(files)})
    assert not changed, f"a test wrote into the shared store {path} ({', '.join(changed[:3])}): use a copy"
    return path


def cli_warnings(sample: Path, factory: pytest.TempPathFactory) -> list[str]:
    """What the engine mappers warned while `tailscope ingest` read `sample` (the store ingested if not yet)."""
    store(sample, factory, cli=True)
    return _warnings[sample.resolve()]


def copy(sample: Path, factory: pytest.TempPathFactory, dest: Path, *, cli: bool = False) -> Path:
    """A fresh copy of `store(sample)` at `dest` (which must not exist), for a test that writes into it."""
    shutil.copytree(store(sample, factory, cli=cli), dest)
    return dest
