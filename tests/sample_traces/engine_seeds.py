"""The engine siblings of the accuracy suite on seeds 2-5: the slow-replica incident in each engine's own trace format
(vLLM, SGLang, TGI, Triton), mapped by its real mapper, reported and judged by the suite's rules (seeded.check_found).

Seed 1 takes the whole real path in each sibling's own file (the committed sample through `tailscope ingest`, or
posted to `tailscope collect` from one address per replica). Here the same lines go to `ingest_files` in process; for
the engines whose resource is `service.name` alone (TGI, Triton) each replica's resources get the `tailscope.peer`
address `collect` would add (intake.peer), so the replica is named by its address as there.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from intake.ingest import ingest_files
from sample_traces import sglang_incident, tgi_incident, triton_incident, vllm_incident
from sample_traces.generate import DURATION_S, RATE
from sample_traces.incidents import SimRequest, run
from tests.sample_traces.seeded import check_found, report_of
from tracing import schema as S

#: The seeds the siblings' files judge here (seed 1 is their committed sample, through the whole real path).
ENGINE_SEEDS = (2, 3, 4, 5)
#: Lines of every replica (vLLM, SGLang), or lines per sending address (TGI, Triton).
LINES: dict[str, Callable[[Sequence[SimRequest], int], Any]] = {
    "vllm": vllm_incident.lines, "sglang": sglang_incident.lines,
    "tgi": tgi_incident.lines_by_address, "triton": triton_incident.lines_by_address,
}
#: The stage each engine's mapping reports for the truth's decode (Triton's compute span does not split prefill
#: from decode: docs/engines.md).
STAGE = {"triton": S.GENERATION}
#: (engine, seed) the report does not get right, and why (measured); strict xfails, as seeded.KNOWN_MISSES.
KNOWN_ENGINE_MISSES: dict[tuple[str, int], str] = {}


def engine_seed(engine: str, seed: int) -> Any:
    """`seed` as a parameter, marked xfail (strict) when it is a known miss of `engine`."""
    reason = KNOWN_ENGINE_MISSES.get((engine, seed))
    return pytest.param(seed, marks=pytest.mark.xfail(reason=reason, strict=True)) if reason else seed


def with_peer(line: str, address: str) -> str:
    """An OTLP/JSON line with `tailscope.peer` = `address` on every resource (what `collect` records)."""
    doc = json.loads(line)
    for rs in doc.get("resourceSpans", []):
        attrs = rs.setdefault("resource", {}).setdefault("attributes", [])
        attrs.append({"key": S.ATTR_PEER, "value": {"stringValue": address}})
    return json.dumps(doc)


def check_engine(engine: str, seed: int, tmp_path: Path) -> None:
    """Simulate the slow-replica incident on `seed`, write it in `engine`'s format, ingest and report it, and judge it
    by the suite's rules: every request that reached a replica stored, the window, the stage, the replica first."""
    scenario = run("slow_replica", seed, DURATION_S, RATE)
    made = LINES[engine](scenario.requests, seed)
    truth: dict[str, Any] = scenario.truth(None)
    if isinstance(made, dict):  # per address: the replica is named by it
        lines = [with_peer(line, addr) for addr, per in made.items() for line in per]
        named = tgi_incident.replica_addresses(scenario.requests)[truth["value"]]
    else:
        lines, named = made, truth["value"]
    path = tmp_path / f"{engine}.otlp.jsonl"
    path.write_text("\n".join(lines) + "\n")
    ingest_files([path], tmp_path / "store")
    report = report_of(tmp_path / "store")
    assert report["requests"] == sum(1 for r in scenario.requests if vllm_incident.reached_vllm(r))
    t = {**truth, "stage": STAGE.get(engine, truth["stage"]),
         "accept": [{"dimension": truth["dimension"], "value": named}]}
    check_found(f"{engine} seed {seed}", report, t)
