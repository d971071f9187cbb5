"""`pip install tailscope` (no extra) gives a working serving side: OpenTelemetry only.

A fresh venv gets the package built as a wheel, with its declared dependencies and nothing
else (pip's cache and the package registry, as any install). A request instrumented there
through the OpenTelemetry SDK path reaches an exporter; duckdb, polars, pyarrow and
streamlit are not importable; the store exporter without pyarrow is one line naming the
`store` extra, and so is the `tailscope` command. The wheel is built as on a machine without
a C compiler: the build goes on without the optional decoder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # an end-to-end run (CONTRIBUTING.md: make test-fast leaves it out)

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import importlib.util, json, logging, sys, tempfile

heavy = {m: importlib.util.find_spec(m) is not None for m in ("duckdb", "polars", "pyarrow", "streamlit", "numpy")}

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import tracing

memory = InMemorySpanExporter()
telemetry = tracing.configure("bare", replica_id="r0", exporters="none", extra_exporters=[memory])
with tracing.request(model="m", tenant="t") as req:
    with req.stage("queue_wait"):
        pass
    with req.stage("generation"):
        with req.stage("prefill"):
            pass
telemetry.flush()
names = sorted(s.name for s in memory.get_finished_spans())
telemetry.shutdown()

lines = []
class Keep(logging.Handler):
    def emit(self, record):
        lines.append(record.getMessage())
logging.getLogger().addHandler(Keep())
store = tempfile.mkdtemp()
with_store = tracing.configure("bare", exporters="store", store=store, set_global=False)
with_store.shutdown()

from tracing.errors import MissingExtra
from tracing.store import SegmentWriter
try:
    SegmentWriter(store)
    writer_error = None
except MissingExtra as exc:
    writer_error = str(exc)

loaded = sorted(m for m in ("duckdb", "polars", "pyarrow", "streamlit") if m in sys.modules)
print(json.dumps({"heavy": heavy, "names": names, "log": lines, "writer_error": writer_error, "loaded": loaded,
                  "where": tracing.__file__}))
"""


def _run(args: list[str], extra_env: dict[str, str] | None = None, **kw: Any) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(extra_env or {})
    return subprocess.run(args, capture_output=True, text=True, env=env, **kw)


def _setuptools_version() -> tuple[int, ...]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return tuple(int(x) for x in version("setuptools").split(".")[:2] if x.isdigit())
    except PackageNotFoundError:
        return (0,)


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the tailscope wheel and its declared (base) dependencies only."""
    base = tmp_path_factory.mktemp("bare")
    source = base / "source"  # a clean copy: an in-tree build/ directory may hold modules that moved away
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", "*.so", "test-artifacts", "store", ".*_cache"))
    wheels = base / "wheels"
    isolation = [] if _setuptools_version() < (77,) else ["--no-build-isolation"]  # dev extra: setuptools>=77
    # built as on a machine without a C compiler: the optional decoder is skipped with a note
    no_compiler = {"CC": str(base / "no-such-compiler")}
    built = _run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", *isolation,
                  "-w", str(wheels), str(source)], cwd=base, extra_env=no_compiler)
    assert built.returncode == 0, built.stderr
    notes = [line for line in (built.stdout + built.stderr).splitlines() if "note: the optional C part" in line]
    assert any("intake._otlpx" in n for n in notes) and any("analysis._replay" in n for n in notes), notes
    wheel = next(wheels.glob("tailscope-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    for part in ("intake/_otlpx", "analysis/_replay"):  # the sources travel, nothing compiled does
        assert f"{part}.c" in names and not [n for n in names if n.startswith(f"{part}.") and not n.endswith(".c")]
    assert not [n for n in names if n.startswith(("examples/", "tests/"))]
    env_dir = base / "venv"
    venv.create(env_dir, with_pip=False)  # pip itself is not put in it (ensurepip: about 3 CPU-seconds)
    python = env_dir / "bin" / "python"
    # this pip installs into the new venv's interpreter (--python): the same resolution and install, from outside
    installed = _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", str(wheel)],
                     cwd=base)
    assert installed.returncode == 0, installed.stderr
    return env_dir


def test_bare_install_instruments_a_request_without_the_heavy_packages(bare_venv: Path, tmp_path: Path) -> None:
    done = _run([str(bare_venv / "bin" / "python"), "-c", SCRIPT], cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["heavy"] == {"duckdb": False, "polars": False, "pyarrow": False, "streamlit": False, "numpy": False}
    assert out["where"].startswith(str(bare_venv)), "the installed package must be the one under test"
    assert out["names"] == ["generation", "inference m", "prefill", "queue_wait"]  # request span: "inference <model>"
    assert out["loaded"] == []
    needs = "needs pyarrow, which is not installed: pip install 'tailscope[store]'"
    assert out["writer_error"] == f"the segment store {needs}"
    store_lines = [line for line in out["log"] if "cannot write traces" in line]
    assert len(store_lines) == 1 and needs in store_lines[0], out["log"]


def test_bare_install_cli_names_the_extra(bare_venv: Path, tmp_path: Path) -> None:
    done = _run([str(bare_venv / "bin" / "tailscope"), "--help"], cwd=tmp_path, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip() == ("the tailscope command needs typer, which is not installed: "
                                   "pip install 'tailscope[analysis]' (or [collect], [dashboard], [all])")
