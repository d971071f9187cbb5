"""The public surface of `tracing` is what was meant, and importing it stays cheap."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import tracing

ROOT = Path(__file__).parents[2]

EXPECTED = {
    # stage names (the schema's vocabulary)
    "NETWORK", "QUEUE_WAIT", "PREPROCESS", "MODEL_LOAD", "GENERATION", "PREFILL", "DECODE", "STREAMING",
    # requests and stages
    "request", "stage", "traced_request", "current_request", "Request", "Stage", "StageSpan",
    "ClientDisconnected",
    # streaming
    "stream", "TokenStream", "AsyncTokenStream",
    # across a queue
    "inject", "extract", "resume", "apply_report", "RemoteRequest",
    # client side
    "client_request", "post_json", "ClientCall", "ClientResult",
    # configuration
    "configure", "Telemetry", "ENV_VARS",
    # the lean path
    "LeanRecorder", "LeanRequest",
}


def test_all_is_exactly_the_public_surface() -> None:
    assert set(tracing.__all__) == EXPECTED
    assert len(tracing.__all__) == len(EXPECTED)
    for name in tracing.__all__:
        assert getattr(tracing, name) is not None, name
    public = {n for n in dir(tracing) if not n.startswith("_")}
    submodules = {"configure", "instrument", "propagation", "streaming", "schema", "client", "lean", "exporters",
                  "rows", "store", "otlp_json", "errors", "settings"}
    assert public - submodules - EXPECTED == set(), "unexpected public names"


def test_public_callables_have_docstrings() -> None:
    for name in tracing.__all__:
        obj = getattr(tracing, name)
        if callable(obj):
            assert (obj.__doc__ or "").strip(), f"tracing.{name} has no docstring"


def test_import_loads_only_opentelemetry_api() -> None:
    code = ("import sys, json, tracing; "
            "print(json.dumps(sorted(m for m in sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout))
    for heavy in ("duckdb", "polars", "streamlit", "httpx", "opentelemetry.sdk", "opentelemetry.exporter",
                  "pyarrow", "tracing.store", "tracing.lean", "tracing.client", "tracing.exporters",
                  "analysis", "asyncio", "ssl"):  # asyncio (and ssl through it): only for code that uses it
        assert heavy not in loaded, f"import tracing loads {heavy}"
    assert "opentelemetry.trace" in loaded
