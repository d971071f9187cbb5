"""A reader queries the store with `tailscope sql` while the receiver writes: no error, counts only grow."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from analysis.engine.connect import connect
from tests.intake.collect_helpers import ROOT, pb_body, running
from tests.sql import one

BODIES = 120
SPANS_PER_BODY = 300


@pytest.mark.slow
def test_reader_sees_only_growing_counts_while_receiver_ingests(tmp_path: Path) -> None:
    store = tmp_path / "store"
    rng = random.Random(11)
    bodies = [pb_body(SPANS_PER_BODY, rng)[0] for _ in range(BODIES)]
    with running(store, grpc_port=None) as receiver:
        url = f"http://127.0.0.1:{receiver.http_port}/v1/traces"
        headers = {"Content-Type": "application/x-protobuf"}
        assert httpx.post(url, content=bodies[0], headers=headers).status_code == 200
        done = threading.Event()
        statuses: list[int] = []

        def send() -> None:
            with httpx.Client() as client:
                for body in bodies[1:]:
                    statuses.append(client.post(url, content=body, headers=headers).status_code)
            done.set()

        writer = threading.Thread(target=send)
        writer.start()
        cli_counts: list[int] = []
        api_counts: list[int] = []
        for _ in range(6):  # the CLI, as a user would run it
            out = subprocess.run([sys.executable, "-m", "tailscope.cli", "sql", "SELECT count(*) AS n FROM spans",
                                  "--store", str(store), "--format", "csv"], cwd=ROOT, capture_output=True,
                                 text=True, timeout=120)
            assert out.returncode == 0, out.stderr
            cli_counts.append(int(out.stdout.splitlines()[1]))
        for _ in range(400):  # and the Python API in a tight loop
            con = connect(store)
            api_counts.append(one(con, "SELECT count(*) FROM requests")[0] + one(con, "SELECT count(*) FROM spans")[0])
            con.close()
            if done.is_set():
                break
        writer.join(120)
    assert statuses == [200] * (BODIES - 1)
    assert cli_counts == sorted(cli_counts) and api_counts == sorted(api_counts)
    assert cli_counts[0] >= SPANS_PER_BODY
    con = connect(store)
    assert con.execute("SELECT count(*) FROM spans").fetchone() == (BODIES * SPANS_PER_BODY,)
