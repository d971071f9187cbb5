"""Benchmark inputs that say what built them, so a benchmark never measures an input another version made.

A benchmark's input (a store, an exported ClickHouse directory) is built by a function of this
tree, `builder(path, **params)`, and may be kept under --dir for the next run. Beside it a stamp
(STAMP, JSON) records its fingerprint: the sha256 of the source of every module of this repository
the builder's module imports (followed through their imports, wherever the import statement sits),
the builder's name and parameters, and the versions of the libraries that write the files (numpy,
pyarrow, duckdb, chdb); and, unless `manifest=False`, every file the build left (path, size, mtime).

`prepare` reuses an input only when its stamp has the fingerprint of the code running now and its
files are the ones the build left; a file or directory added since (a materialized hour, alert state:
anything a benchmark derived from it) is removed, so every run starts from the input as built. A stamp
that differs, or a file changed or missing, rebuilds it, saying why in one line. A directory there
without a stamp is refused (it may be someone's data): `InputError`, one line. Builds go to a hidden
sibling first and are renamed into place, so an interrupted build leaves nothing that looks built.
"""

from __future__ import annotations

import ast
import fcntl
import functools
import hashlib
import importlib.metadata
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
#: The stamp file inside every prepared input.
STAMP = ".bench-input.json"
#: Libraries whose version changes the bytes an input's builder writes.
LIBRARIES = ("numpy", "pyarrow", "duckdb", "chdb")


class InputError(SystemExit):
    """An input this module will not touch (not built by a benchmark) or not as required: a one-line exit."""


#: The lock files this process holds, one an input, kept open (and so locked) until the process ends.
_HELD: dict[Path, IO[str]] = {}


def hold(path: Path) -> None:
    """Lock the input `path` for this process, so a second run with the same --dir stops before it touches it.

    The lock is `flock` on a hidden sibling file, released by the system when the process ends however it
    ends; another process holding it is an InputError (one line), never a half-removed directory.
    """
    path = Path(path).absolute()
    if path in _HELD:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path.parent / f".{path.name}.lock", "w")  # noqa: SIM115 (held open for the process's life)
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise InputError(f"{path}: in use by another process (a benchmark run with the same --dir?); "
                         "wait for it to end or choose another --dir") from None
    _HELD[path] = f


def _packages() -> frozenset[str]:
    return frozenset(p.parent.name for p in ROOT.glob("*/__init__.py"))


def _module_path(name: str) -> Path | None:
    """The source file of a module of this repository, or None when it is not one."""
    base = ROOT.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _imports(name: str, path: Path) -> tuple[str, ...]:
    """Every module of this repository the file imports (any import statement, at any depth)."""
    st = path.stat()
    return _imports_of(name, str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=4096)
def _imports_of(name: str, file: str, mtime_ns: int, size: int) -> tuple[str, ...]:
    """_imports, parsed once per version of the file (its mtime and size key the cache)."""
    return tuple(_parse_imports(name, Path(file)))


def _parse_imports(name: str, path: Path) -> Iterator[str]:
    ours = _packages()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")[: None if is_package else -1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" if _module_path(f"{base}.{alias.name}") else base
                       for alias in node.names]
        yield from (t for t in targets if t.split(".")[0] in ours and _module_path(t))


def source_closure(module: str) -> dict[str, str]:
    """sha256 of the source of `module` and of every module of this repository it imports, transitively."""
    seen: dict[str, str] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        path = _module_path(name)
        if name in seen or path is None:
            continue
        seen[name] = hashlib.sha256(path.read_bytes()).hexdigest()
        todo.extend(_imports(name, path))
    return dict(sorted(seen.items()))


def _version(lib: str) -> str | None:
    try:
        return importlib.metadata.version(lib)
    except importlib.metadata.PackageNotFoundError:
        return None


def fingerprint(builder: Callable[..., Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """What made an input: the builder, its parameters, its modules' sources and the writing libraries."""
    modules = source_closure(builder.__module__)
    described = {"builder": f"{builder.__module__}.{builder.__qualname__}",
                 "params": json.loads(json.dumps(dict(params), sort_keys=True, default=str)),
                 "modules": modules, "libraries": {lib: _version(lib) for lib in LIBRARIES},
                 "python": sys.version.split()[0]}
    described["digest"] = hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:16]
    return described


def _listing(path: Path) -> tuple[dict[str, list[int]], list[str]]:
    """(files: relative path -> [size, mtime ns], directories) under `path`, the stamp left out."""
    files: dict[str, list[int]] = {}
    dirs: list[str] = []
    for entry in sorted(path.rglob("*")):
        rel = entry.relative_to(path).as_posix()
        if rel == STAMP:
            continue
        if entry.is_dir():
            dirs.append(rel)
        else:
            st = entry.stat()
            files[rel] = [st.st_size, st.st_mtime_ns]
    return files, dirs


def read_stamp(path: Path) -> dict[str, Any] | None:
    """The stamp of a prepared input, or None when there is none (or it is unreadable)."""
    try:
        stamp = json.loads((path / STAMP).read_text())
    except (OSError, ValueError):
        return None
    return stamp if isinstance(stamp, dict) else None


def _why_stale(stamp: dict[str, Any], want: dict[str, Any]) -> str | None:
    """Why an input stamped `stamp` is not what `want` describes (one phrase), or None when it is."""
    if stamp.get("digest") == want["digest"]:
        return None
    for key in ("builder", "params", "libraries", "python"):
        if stamp.get(key) != want[key]:
            return f"its {key} differ ({stamp.get(key)} then, {want[key]} now)"
    old, new = stamp.get("modules") or {}, want["modules"]
    changed = sorted(set(old) ^ set(new) | {m for m in set(old) & set(new) if old[m] != new[m]})
    return f"the code that built it changed ({', '.join(changed)})"


def _tidy(path: Path, stamp: dict[str, Any], keep: tuple[str, ...] = ()) -> str | None:
    """Remove what was added since the build, except under the top-level directories `keep`; a reason to rebuild
    when a built file changed or is missing."""
    built: dict[str, list[int]] = stamp.get("files") or {}
    files, dirs = _listing(path)
    for rel, meta in built.items():
        if files.get(rel) != meta:
            if rel not in files:
                return f"{rel} is missing"
            return (f"{rel} is not as built (its size or modification time changed; a copy keeps both with "
                    "`cp -a`)")
    built_dirs = set(stamp.get("dirs") or [])
    added = [d for d in dirs if d not in built_dirs]
    added = [d for d in added if not any(d.startswith(a + "/") for a in added)]  # the top-most ones
    added = [d for d in added if d.split("/")[0] not in keep]
    for rel in added:
        shutil.rmtree(path / rel, ignore_errors=True)
    extra = [rel for rel in files if rel not in built and rel.split("/")[0] not in keep and (path / rel).exists()]
    for rel in extra:
        (path / rel).unlink()
    if added or extra:
        print(f"{path}: removed what earlier runs added ({', '.join((added + extra)[:4])}"
              f"{', ...' if len(added) + len(extra) > 4 else ''})", file=sys.stderr)
    return None


def check(path: Path, builder: Callable[..., Any], **params: Any) -> dict[str, Any]:
    """The stamp of `path` when it was built by `builder(**params)` with the code running now; else InputError."""
    stamp = read_stamp(path)
    if stamp is None:
        raise InputError(f"{path}: not built by a benchmark (no {STAMP}); build it first")
    why = _why_stale(stamp, fingerprint(builder, params))
    if why:
        raise InputError(f"{path}: built by other code or parameters: {why}; build it again")
    return stamp


def matches(path: Path, builder: Callable[..., Any], **params: Any) -> bool:
    """Whether `path` is stamped as built by `builder(**params)` with the code running now (files not checked)."""
    hold(path)
    stamp = read_stamp(path)
    return stamp is not None and _why_stale(stamp, fingerprint(builder, params)) is None


def record(path: Path, builder: Callable[..., Any], params: Mapping[str, Any], *, manifest: bool = True) -> str:
    """Write the stamp of an input `builder` just built in `path`; its digest."""
    stamp = fingerprint(builder, params)
    if manifest:
        stamp["files"], stamp["dirs"] = _listing(path)
    stamp["built_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    (path / STAMP).write_text(json.dumps(stamp, indent=1, sort_keys=True))
    return str(stamp["digest"])


def clear(path: Path) -> None:
    """Remove an input a benchmark built (stamped) so it can be built again; refuse anything else."""
    hold(path)
    if not path.exists():
        return
    if read_stamp(path) is None and (not path.is_dir() or any(path.iterdir())):
        raise InputError(f"{path}: exists and was not built by a benchmark (no {STAMP}); "
                         "remove it or choose another --dir")
    shutil.rmtree(path)


def prepare(path: Path, builder: Callable[..., Any], *, manifest: bool = True, keep: tuple[str, ...] = (),
            **params: Any) -> float | None:
    """Make `path` hold exactly what `builder(path, **params)` builds with the code running now.

    Reused when its stamp matches (what earlier runs added removed, except under the top-level directories
    `keep`: what a reader of the input may be using, that the code rebuilds when stale); else built again, in
    a hidden sibling renamed into place. Returns the build's seconds, or None when reused. One line on stderr
    says which and why.
    """
    path = Path(path)
    hold(path)
    want = fingerprint(builder, params)
    stamp = read_stamp(path)
    if stamp is not None:
        why = _why_stale(stamp, want) or (_tidy(path, stamp, keep) if manifest else None)
        if why is None:
            print(f"{path}: reused (fingerprint {want['digest']}: same code and parameters)", file=sys.stderr)
            return None
        print(f"{path}: rebuilding: {why}", file=sys.stderr)
    clear(path)
    tmp = path.parent / f".{path.name}.building-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    try:
        builder(tmp, **params)
        record(tmp, builder, params, manifest=manifest)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    took = round(time.perf_counter() - t, 2)
    print(f"{path}: built in {took} s (fingerprint {want['digest']})", file=sys.stderr)
    return took
