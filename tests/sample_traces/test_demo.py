"""`tailscope demo --no-dashboard`: the labelled sample into a fresh store, a report that names a spike.

Runs the real console script in a subprocess (stdout is a pipe, not a TTY: the dashboard must
not start, the command that opens it is printed instead), twice, to check that loading is
idempotent, and checks the report against the demo's truth file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

from analysis.connect import connect
from sample_traces import generate
from tests.intake.test_engines_clean_input import engine_warnings

TAILSCOPE = Path(sys.executable).parent / "tailscope"


def _demo(store: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([str(TAILSCOPE), "demo", "--no-dashboard", "--store", str(store)], capture_output=True,
                          text=True, env=env, timeout=600, check=False)


def test_demo_loads_the_sample_prints_a_spike_and_the_dashboard_command(tmp_path: Path) -> None:
    store = tmp_path / "store"
    truth = json.loads(generate.DEMO_TRUTH.read_text())
    first = _demo(store)
    assert first.returncode == 0, first.stderr
    out = first.stdout
    assert "spike 1" in out
    assert f"Open the dashboard: tailscope dashboard --store {store}" in out
    for inc in truth["incidents"]:  # the ground truth is printed for comparison
        assert f"{inc['dimension']}={inc['value']}" in out
    con = connect(store)
    assert con.execute("SELECT count(*) FROM requests").fetchone() == (truth["requests"],)
    con.close()

    again = _demo(store)
    assert again.returncode == 0, again.stderr
    assert " 0 spans stored" in again.stdout
    con = connect(store)
    assert con.execute("SELECT count(*) FROM requests").fetchone() == (truth["requests"],)
    con.close()


def test_demo_report_names_each_labelled_incident(tmp_path: Path) -> None:
    """The report over the demo store finds every incident of the timeline with its stage and value."""
    from analysis.report import build_report
    from intake.ingest import ingest_files
    from tracing.store import init_store

    store = init_store(tmp_path / "store")
    with engine_warnings() as warned:
        ingest_files([generate.DEMO_TRACES], store)
    assert warned == [], warned
    con = connect(store)
    report = build_report(con)
    con.close()
    truth = json.loads(generate.DEMO_TRUTH.read_text())
    found = []
    for inc in truth["incidents"]:
        w0, w1 = datetime.fromisoformat(inc["window"]["start"]), datetime.fromisoformat(inc["window"]["end"])
        for spike in report["spikes"]:
            if datetime.fromisoformat(spike["start"]) < w1 and datetime.fromisoformat(spike["end"]) > w0:
                found.append((inc["scenario"], spike["stages"][0]["stage"], spike["dimensions"][0]["value"]))
    assert sorted(found) == sorted((i["scenario"], i["stage"], i["value"]) for i in truth["incidents"])
