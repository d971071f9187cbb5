"""Live mode against a real `tailscope collect`: the dashboard refreshes while the receiver writes."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from streamlit.testing.v1 import AppTest

from tests import servers
from tests.dashboard.conftest import APP
from tracing import schema as S
from tracing.store import init_store

SAMPLE = Path(__file__).parents[2] / "sample_traces" / "data" / "basic.otlp.jsonl.gz"


def _requests_in(lines: list[str]) -> int:
    n = 0
    for line in lines:
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    attrs = {a["key"]: a["value"] for a in span.get("attributes", [])}
                    n += attrs.get(S.ATTR_REQUEST) == {"boolValue": True}
    return n


def _metric(at: AppTest, label: str) -> str:
    return str(next(m.value for m in at.metric if m.label == label))


def test_refresh_while_collect_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = init_store(tmp_path / "store")
    lines = gzip.decompress(SAMPLE.read_bytes()).decode().splitlines()
    exe = Path(sys.executable).parent / "tailscope"
    proc = servers.spawn([str(exe), "collect", "--store", str(store), "--http-port", "0", "--grpc-port", "-1"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        url = None
        for _ in range(200):  # bounded: the first lines hold the address
            line = proc.stdout.readline()
            match = re.search(r"listening http=(\S+):(\d+)", line)
            if match:
                url = f"http://{match.group(1)}:{match.group(2)}/v1/traces"
                break
        assert url, "tailscope collect did not say where it listens"
        out = proc.stdout
        threading.Thread(target=lambda: out.read(), daemon=True).start()  # keep its progress lines flowing

        def post(batch: list[str]) -> None:
            for body in batch:
                r = httpx.post(url, content=body, headers={"Content-Type": "application/json"}, timeout=60)
                assert r.status_code == 200, r.text

        half = len(lines) // 2
        post(lines[:half])
        monkeypatch.setenv("TAILSCOPE_STORE", str(store))
        at = AppTest.from_file(str(APP), default_timeout=120)
        at.run()
        assert not at.exception
        assert _metric(at, "requests") == f"{_requests_in(lines[:half]):,}"
        post(lines[half:])  # the receiver writes while the dashboard holds the store open
        at.button(key="refresh").click().run()
        assert not at.exception
        assert _metric(at, "requests") == f"{_requests_in(lines):,}" == "400"
    finally:
        servers.stop(proc, timeout=60)  # SIGTERM (the receiver writes what it holds), then its whole group
