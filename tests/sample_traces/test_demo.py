"""`tailscope demo --no-dashboard`: the labelled sample into a fresh store, a report that names a spike.

Runs the real console script in a subprocess (stdout is a pipe, not a TTY: the dashboard must
not start, the command that opens it is printed instead), twice, to check that loading is
idempotent, and checks the report against the demo's truth file. The first run's output is also
what README.md's demo block must show (with lines left out only where it says `…`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from datetime import datetime
from pathlib import Path

import pytest

from analysis.engine.connect import connect
from sample_traces import generate
from tests import samples_cache

README = Path(__file__).resolve().parents[2] / "README.md"
#: A line of the README's demo block that stands for any number of lines left out.
ELIDED = "…"


def readme_demo_block() -> tuple[str, list[str]]:
    """The README's demo output: (the command line after `$ `, the output lines shown)."""
    section = README.read_text().split("<!-- demo:begin -->", 1)[1].split("<!-- demo:end -->", 1)[0]
    block = section.split("```\n$ ", 1)[1].split("\n```", 1)[0]
    command, *lines = block.split("\n")
    return command, lines


def unmatched(shown: list[str], output: list[str]) -> str | None:
    """The first line of `shown` that does not follow in `output` (each line exactly, `…` any run of lines), or
    None when `shown` is `output` with some runs of lines left out where it says `…`."""
    at = 0
    skipping = False
    for line in shown:
        if line == ELIDED:
            skipping = True
            continue
        found = next((i for i in range(at, len(output) if skipping else min(at + 1, len(output)))
                      if output[i] == line), None)
        if found is None:
            return line
        at, skipping = found + 1, False
    return None if skipping or at == len(output) else f"(the output goes on: {output[at]!r})"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """A store made by one `tailscope demo --no-dashboard`, and that run (made once in the session, read only:
    tests/samples_cache.py)."""
    return samples_cache.demo(tmp_path_factory)


@pytest.mark.slow
def test_demo_loads_the_sample_prints_a_spike_and_the_dashboard_command(
        demo: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path) -> None:
    store, first = demo
    truth = json.loads(generate.DEMO_TRUTH.read_text())
    assert first.returncode == 0, first.stderr
    out = first.stdout
    # the README shows this run's output (its store named demo-store), lines left out only where it says so
    command, shown = readme_demo_block()
    assert command == "tailscope demo --store demo-store --no-dashboard"
    real = [line.rstrip() for line in out.replace(str(store), "demo-store").splitlines()]
    assert unmatched(shown, real) is None, (
        f"README.md's demo block is stale at {unmatched(shown, real)!r}; the real output:\n" + "\n".join(real))
    assert "spike 1" in out
    assert f"Open the dashboard: tailscope dashboard --store {store}" in out
    for inc in truth["incidents"]:  # the ground truth is printed for comparison
        assert f"{inc['dimension']}={inc['value']}" in out
    con = connect(store)
    assert con.execute("SELECT count(*) FROM requests").fetchone() == (truth["requests"],)
    con.close()

    store = shutil.copytree(store, tmp_path / "store")  # the second run may write: a copy of the shared store
    again = samples_cache.run_demo(store)
    assert again.returncode == 0, again.stderr
    assert " 0 spans stored" in again.stdout
    con = connect(store)
    assert con.execute("SELECT count(*) FROM requests").fetchone() == (truth["requests"],)
    con.close()


@pytest.mark.slow
def test_demo_report_names_each_labelled_incident(demo: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    """The report over the demo's store finds every incident of the timeline with its stage and value; no engine
    mapper complained while the demo loaded the sample (none runs on native spans)."""
    from analysis.report import build_report

    store, first = demo
    assert first.returncode == 0 and "could not map" not in first.stderr, first.stderr
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


def test_unmatched_reads_the_readme_block_as_the_output_with_marked_gaps() -> None:
    """The README check itself: exact lines in order, `…` for a run of lines, nothing left out silently."""
    out = ["a", "b", "c", "d"]
    assert unmatched(["a", "b", "c", "d"], out) is None
    assert unmatched(["a", ELIDED, "d"], out) is None
    assert unmatched([ELIDED, "c", ELIDED], out) is None
    assert unmatched(["a", "c", "d"], out) == "c"  # b left out without a mark
    assert unmatched(["a", "b"], out) == "(the output goes on: 'c')"
    assert unmatched(["a", ELIDED, "x"], out) == "x"
    assert unmatched(["b", "a"], out) == "b"
