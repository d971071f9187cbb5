"""Accuracy suite, SGLang format: the slow-replica incident as SGLang request root spans.

sample_traces/data/engines/sglang_slow_replica.otlp.jsonl.gz (made by sample_traces/sglang_incident.py)
is ingested as `tailscope ingest` does (the session's store of it, tests/samples_cache.py) and goes through
the real `tailscope report --json`. Its resources are what
Resource.create builds (a random service.instance.id per process) plus k8s.pod.name: the report
must name the replica by its pod name, never by the UUID.

Seeds 2-5: the same lines, ingested in process and judged by the suite's rules (engine_seeds.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sample_traces import sglang_incident
from tests import samples_cache
from tests.sample_traces.cli_checks import STAGES, first_spike, sql
from tests.sample_traces.engine_seeds import ENGINE_SEEDS, check_engine, engine_seed

pytestmark = pytest.mark.slow  # an end-to-end run (CONTRIBUTING.md: make test-fast leaves it out)

TRACES = sglang_incident.traces_path()
TRUTH = json.loads(sglang_incident.truth_path().read_text())


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample's store as `tailscope ingest --quiet` writes it, shared with the session (tests/samples_cache.py)."""
    return samples_cache.store(TRACES, tmp_path_factory, cli=True)


def test_every_request_is_mapped_and_named_by_its_pod(store: Path) -> None:
    [row] = sql(store, f"SELECT count(*) AS n, count(DISTINCT replica) AS replicas, "
                        f"count(*) FILTER (WHERE {' + '.join(STAGES)} <> e2e_ns) AS bad_sums, "
                        f"count(*) FILTER (WHERE replica NOT LIKE 'replica-%') AS unnamed FROM requests")
    assert row == {"n": TRUTH["requests"], "replicas": 32, "bad_sums": 0, "unnamed": 0}


def test_report_finds_the_window_the_stage_and_the_pod(store: Path) -> None:
    first_spike(store, TRUTH)


@pytest.mark.parametrize("seed", [engine_seed("sglang", s) for s in ENGINE_SEEDS])
def test_the_same_rules_hold_on_seeds_2_to_5(seed: int, tmp_path: Path) -> None:
    """Seeds 2-5 by the suite's rules (tests/sample_traces/engine_seeds.py: the same lines, ingested in process)."""
    check_engine("sglang", seed, tmp_path)
