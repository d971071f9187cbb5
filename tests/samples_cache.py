"""Stores several test files build alike, built once per test session and shared by every xdist worker:
committed samples ingested with the same options (about 2 CPU-seconds each, and a dozen files did it again),
the fixed synthetic stores of `built` and the simulated catalogue runs of `seeded_store`.

The first worker to ask for a store builds it under the session's shared temporary directory, holding a lock on
it (`fcntl.flock`) so a worker asking meanwhile waits for it rather than building it again; the others read what
it wrote. Every hand-out is read-only and checks that no earlier user (of any worker) changed a file of the store;
`copy` gives a test that writes its own copy. A test of ingestion itself keeps ingesting.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

#: (sample, through the CLI) or a `built` name -> the store, and its files' (path, size, mtime) when it was built
_stores: dict[object, tuple[Path, list[tuple[str, int, int]]]] = {}
_warnings: dict[Path, list[str]] = {}
#: what marks a finished build in its directory: the store's files and what the build noted (the CLI's warnings)
_MANIFEST = "manifest.json"
#: beside the demo's store: its run's exit code, stdout and stderr
_DEMO_RUN = "demo-run.json"


def _files(store: Path) -> list[tuple[str, int, int]]:
    """Every file of the store with its size and modification time: what a writer would change."""
    return sorted((str(p.relative_to(store)), (st := p.stat()).st_size, st.st_mtime_ns)
                  for p in store.rglob("*") if p.is_file())


def _root(factory: pytest.TempPathFactory) -> Path:
    """The directory every process of this session shares: under xdist the parent of the worker's base temporary
    directory (the session's, which the workers' own are made in), else the base temporary directory itself."""
    base = factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "samples-cache"
    root.mkdir(exist_ok=True)
    return root


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (made if missing) across processes; released when the block ends."""
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _shared(key: object, name: str, build: Callable[[Path], list[str]], factory: pytest.TempPathFactory) -> Path:
    """The store of `key` in the session's shared directory `name`: built by `build(store)` (which returns the
    warnings to keep) in the first process that asks, under the lock, and read back from its manifest by the
    others. A build that died half-way (no manifest) is removed and done again."""
    if key not in _stores:
        root = _root(factory)
        where, store = root / name, root / name / "store"
        with _locked(root / f"{name}.lock"):
            if not (where / _MANIFEST).exists():
                shutil.rmtree(where, ignore_errors=True)
                where.mkdir()
                warned = build(store)
                (where / _MANIFEST).write_text(json.dumps({"files": _files(store), "warnings": warned}))
        manifest = json.loads((where / _MANIFEST).read_text())
        _stores[key] = (store, [(p, size, mtime) for p, size, mtime in manifest["files"]])
        if isinstance(key, tuple) and key[1]:
            _warnings[key[0]] = list(manifest["warnings"])
    return _unchanged(key)


def store(sample: Path, factory: pytest.TempPathFactory, *, cli: bool = False) -> Path:
    """The store of `sample`, ingested on first use in the session by `intake.ingest.ingest_files` or, with `cli`,
    the store `tailscope ingest --quiet` writes: that ingest with the hours it wrote materialized
    (tailscope/commands/ingest.py; the command itself is tested in tests/intake and tests/tailscope). The `cli`
    store is a copy of the other with its hours materialized, so a sample is decoded once a session (about 1.7
    CPU-seconds each; test_clickhouse.py reads every sample's store, test_accuracy.py the catalogue's `cli` ones).
    Read it only; `copy` for a store to write."""
    key = (sample.resolve(), cli)
    tag = hashlib.sha256(str(key[0]).encode()).hexdigest()[:8]
    name = f"sample-{sample.name.split('.')[0]}-{tag}" + ("-cli" if cli else "")

    def build(path: Path) -> list[str]:
        from tests.intake.test_engines_clean_input import engine_warnings

        if not cli:
            from intake.ingest import ingest_files

            with engine_warnings() as warned:
                ingest_files([sample], path)
            return list(warned)
        from analysis.engine.materialize import materialize

        ingested = store(sample, factory)
        shutil.copytree(ingested, path)
        with engine_warnings() as warned:
            materialize(path)
        return [*json.loads((ingested.parent / _MANIFEST).read_text())["warnings"], *warned]

    return _shared(key, name, build, factory)


def built(name: str, build: Callable[[Path], object], factory: pytest.TempPathFactory) -> Path:
    """The store `build(path)` writes (a deterministic builder, one per `name` in the whole suite), built on first
    use in the session; read only."""
    def run(path: Path) -> list[str]:
        build(path)
        return []

    return _shared(name, f"built-{name}", run, factory)


def seeded_store(name: str, seed: int, factory: pytest.TempPathFactory, scenario: Any = None) -> Path:
    """The store of catalogue entry `name` simulated on `seed` for the committed samples' length and rate, written
    straight (`sample_traces.emit.write_store`, no hour materialized), built on first use in the session; read only
    (the seeded accuracy files judge it, test_clickhouse.py compares both engines' reports of two of them).
    `scenario`: that simulation when the caller has run it already (`incidents.run` with the same arguments), written
    instead of being run again."""
    def build(path: Path) -> None:
        from sample_traces import generate
        from sample_traces.emit import write_store
        from sample_traces.incidents import run

        got = scenario if scenario is not None else run(name, seed, generate.DURATION_S, generate.RATE)
        assert (got.incident.name, got.seed) == (name, seed), "the scenario of another run"
        write_store(path, got.config, got.requests, seed)

    return built(f"seeded-{name}-{seed}", build, factory)


def run_demo(store: Path) -> subprocess.CompletedProcess[str]:
    """`tailscope demo --no-dashboard --store STORE`, the console script in a subprocess, 200 columns wide."""
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([str(Path(sys.executable).parent / "tailscope"), "demo", "--no-dashboard", "--store",
                           str(store)], capture_output=True, text=True, env=env, timeout=600, check=False)


def demo(factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The store one `tailscope demo --no-dashboard --store STORE` wrote (the console script in a subprocess, its
    stdout a pipe: the dashboard does not start), and that run (its code and output, kept beside the store), made
    on first use in the session; read only (the demo's tests and the browser benchmark's smoke run read it)."""
    def build(path: Path) -> list[str]:
        done = run_demo(path)
        (path.parent / _DEMO_RUN).write_text(json.dumps([done.returncode, done.stdout, done.stderr]))
        return []

    store = _shared("demo", "demo", build, factory)
    code, out, err = json.loads((store.parent / _DEMO_RUN).read_text())
    return store, subprocess.CompletedProcess(["tailscope", "demo"], code, out, err)


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
