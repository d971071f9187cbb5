"""Accuracy suite, Triton OpenTelemetry format through `tailscope collect`: replicas named by address.

The slow-replica incident as Triton exports it (sample_traces/triton_incident.py): a resource of
service.name alone, no status, no prefill/decode split. Each replica posts its OTLP/JSON from its
own loopback address; `tailscope report --json` must find the window, `generation` (Triton's
finest stage; the truth's decode lies in it) and the slow replica by that address.
"""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sample_traces import tgi_incident, triton_incident
from sample_traces.generate import DURATION_S, RATE
from sample_traces.incidents import run
from tailscope.cli import app
from tests.intake.collect_helpers import running
from tests.sample_traces.test_vllm_accuracy import STAGES, _ns

runner = CliRunner()
#: (store, truth + requests that reached a replica, simulated replica → its address)
Incident = tuple[Path, dict[str, Any], dict[str, str]]


@pytest.fixture(scope="module")
def incident(tmp_path_factory: pytest.TempPathFactory) -> Incident:
    scenario = run("slow_replica", tgi_incident.SEED, DURATION_S, RATE)
    truth = scenario.truth(None)
    store = tmp_path_factory.mktemp("triton") / "store"
    with running(store, grpc_port=None, record_peer=True) as receiver:
        assert receiver.http_port is not None
        for addr, lines in triton_incident.lines_by_address(scenario.requests).items():
            conn = http.client.HTTPConnection("127.0.0.1", receiver.http_port, timeout=60, source_address=(addr, 0))
            for line in lines:
                conn.request("POST", "/v1/traces", body=line.encode(), headers={"Content-Type": "application/json"})
                response = conn.getresponse()
                assert response.status == 200, response.read()
                response.read()
            conn.close()
    reached = sum(1 for r in scenario.requests if tgi_incident.reached_vllm(r))
    return store, {**truth, "reached": reached}, tgi_incident.replica_addresses(scenario.requests)


def _sql(store: Path, query: str) -> list[dict[str, Any]]:
    result = runner.invoke(app, ["sql", query, "--store", str(store), "--format", "json"])
    assert result.exit_code == 0, result.output
    rows: list[dict[str, Any]] = json.loads(result.stdout)
    return rows


def test_every_triton_request_is_mapped_and_named_by_its_address(incident: Incident) -> None:
    store, truth, addresses = incident
    [row] = _sql(store, f"SELECT count(*) AS n, count(DISTINCT replica) AS replicas, "
                        f"count(*) FILTER (WHERE {' + '.join(STAGES)} <> e2e_ns) AS bad_sums, "
                        f"count(*) FILTER (WHERE replica NOT LIKE '127.0.0.%') AS unnamed FROM requests")
    assert row == {"n": truth["reached"], "replicas": len(addresses), "bad_sums": 0, "unnamed": 0}


def test_report_finds_the_window_generation_and_the_address(incident: Incident) -> None:
    store, truth, addresses = incident
    result = runner.invoke(app, ["report", "--store", str(store), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["spikes"], report["errors"]
    spike = report["spikes"][0]
    window = truth["window"]
    slack = report["window_s"] * 1_000_000_000
    start_ns, end_ns = _ns(spike["start"]), _ns(spike["end"])
    assert window["start_ns"] - slack <= start_ns < window["end_ns"]
    assert window["start_ns"] < end_ns <= window["end_ns"] + slack
    assert truth["stage"] == "decode" and spike["stages"][0]["stage"] == "generation"
    first = spike["dimensions"][0]
    assert (first["dimension"], first["value"]) == (truth["dimension"], addresses[truth["value"]])
