"""Accuracy suite, Triton OpenTelemetry format through `tailscope collect`: replicas named by address.

The slow-replica incident as Triton exports it (sample_traces/triton_incident.py): a resource of
service.name alone, no status, no prefill/decode split. Each replica posts its OTLP/JSON from its
own loopback address; `tailscope report --json` must find the window, `generation` (Triton's
finest stage; the truth's decode lies in it) and the slow replica by that address.

Seeds 2-5: the same lines, ingested in process and judged by the suite's rules (engine_seeds.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sample_traces import triton_incident
from tests.sample_traces.collect_accuracy import Incident, check_mapped_and_named, post_incident, report_spike
from tests.sample_traces.engine_seeds import ENGINE_SEEDS, check_engine, engine_seed

pytestmark = pytest.mark.slow  # an end-to-end run (CONTRIBUTING.md: make test-fast leaves it out)


@pytest.fixture(scope="module")
def incident(tmp_path_factory: pytest.TempPathFactory) -> Incident:
    return post_incident(tmp_path_factory.mktemp("triton") / "store", triton_incident.lines_by_address)


def test_every_triton_request_is_mapped_and_named_by_its_address(incident: Incident) -> None:
    check_mapped_and_named(incident)


def test_report_finds_the_window_generation_and_the_address(incident: Incident) -> None:
    assert incident[1]["stage"] == "decode"  # Triton's compute span does not split prefill from decode
    report_spike(incident, stage="generation")


@pytest.mark.parametrize("seed", [engine_seed("triton", s) for s in ENGINE_SEEDS])
def test_the_same_rules_hold_on_seeds_2_to_5(seed: int, tmp_path: Path) -> None:
    """Seeds 2-5 by the suite's rules (tests/sample_traces/engine_seeds.py: the same lines, ingested in process)."""
    check_engine("triton", seed, tmp_path)
