"""The slow-replica incident written as an engine with a bare resource (TGI, Triton), posted to a running
`tailscope collect` from one loopback address per replica, and the checks both suites make of it."""

from __future__ import annotations

import http.client
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sample_traces import tgi_incident
from sample_traces.generate import DURATION_S, RATE
from sample_traces.incidents import SimRequest, run
from tests.intake.collect_helpers import running
from tests.sample_traces.cli_checks import STAGES, first_spike, sql

#: (store, truth + requests that reached a replica, simulated replica → its address)
Incident = tuple[Path, dict[str, Any], dict[str, str]]


def post_incident(store: Path, lines_by_address: Callable[[Sequence[SimRequest]], dict[str, list[str]]]) -> Incident:
    """Simulate the incident, post each replica's OTLP/JSON lines from its own address, return what was sent."""
    scenario = run("slow_replica", tgi_incident.SEED, DURATION_S, RATE)
    truth = scenario.truth(None)
    with running(store, grpc_port=None, record_peer=True) as receiver:
        assert receiver.http_port is not None
        for addr, lines in lines_by_address(scenario.requests).items():
            conn = http.client.HTTPConnection("127.0.0.1", receiver.http_port, timeout=60, source_address=(addr, 0))
            for line in lines:
                conn.request("POST", "/v1/traces", body=line.encode(), headers={"Content-Type": "application/json"})
                response = conn.getresponse()
                assert response.status == 200, response.read()
                response.read()
            conn.close()
    reached = sum(1 for r in scenario.requests if tgi_incident.reached_vllm(r))
    return store, {**truth, "reached": reached}, tgi_incident.replica_addresses(scenario.requests)


def check_mapped_and_named(incident: Incident) -> None:
    """Every request that reached a replica is stored, its stages sum to e2e, its replica is its address."""
    store, truth, addresses = incident
    [row] = sql(store, f"SELECT count(*) AS n, count(DISTINCT replica) AS replicas, "
                       f"count(*) FILTER (WHERE {' + '.join(STAGES)} <> e2e_ns) AS bad_sums, "
                       f"count(*) FILTER (WHERE replica NOT LIKE '127.0.0.%') AS unnamed FROM requests")
    assert row == {"n": truth["reached"], "replicas": len(addresses), "bad_sums": 0, "unnamed": 0}


def report_spike(incident: Incident, stage: str | None = None) -> dict[str, Any]:
    """`tailscope report --json`'s first spike, checked against the truth's window, `stage` (default: the truth's)
    and the slow replica's address (`cli_checks.first_spike`)."""
    store, truth, addresses = incident
    return first_spike(store, truth, stage=stage, value=addresses[truth["value"]])
