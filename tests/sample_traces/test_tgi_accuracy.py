"""Accuracy suite, TGI format through `tailscope collect`: replicas named by the sending address.

The slow-replica incident as TGI's router exports it (sample_traces/tgi_incident.py): a resource
of service.name alone, so only the receiver's `tailscope.peer` tells replicas apart. Each
replica posts its OTLP/JSON from its own loopback address; `tailscope report --json` must find
the window, decode, and the slow replica by that address.

Seeds 2-5: the same lines, ingested in process and judged by the suite's rules (engine_seeds.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sample_traces import tgi_incident
from tests.sample_traces.collect_accuracy import Incident, check_mapped_and_named, post_incident, report_spike
from tests.sample_traces.engine_seeds import ENGINE_SEEDS, check_engine, engine_seed

pytestmark = pytest.mark.slow  # an end-to-end run (CONTRIBUTING.md: make test-fast leaves it out)


@pytest.fixture(scope="module")
def incident(tmp_path_factory: pytest.TempPathFactory) -> Incident:
    return post_incident(tmp_path_factory.mktemp("tgi") / "store", tgi_incident.lines_by_address)


def test_every_request_is_mapped_and_named_by_its_address(incident: Incident) -> None:
    check_mapped_and_named(incident)


def test_report_finds_the_window_the_stage_and_the_address(incident: Incident) -> None:
    report_spike(incident)


@pytest.mark.parametrize("seed", [engine_seed("tgi", s) for s in ENGINE_SEEDS])
def test_the_same_rules_hold_on_seeds_2_to_5(seed: int, tmp_path: Path) -> None:
    """Seeds 2-5 by the suite's rules (tests/sample_traces/engine_seeds.py: the same lines, ingested in process)."""
    check_engine("tgi", seed, tmp_path)
