"""The accuracy suite and the quarter-sampling check on seed 3 (tests/sample_traces/seeded.py: runs and rules).

One file per seed, so `pytest -n auto --dist loadfile` spreads the seeds over its workers."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.sample_traces import seeded as S

pytestmark = pytest.mark.slow  # simulated fleets reported (make test-fast leaves it out)
SEED = 3


@pytest.mark.parametrize("name", [S.known_miss(n, SEED) for n in S.NAMES])
def test_every_catalogue_entry_is_judged_right(name: str, tmp_path: Path) -> None:
    S.check_catalogue_entry(name, SEED, tmp_path)


@pytest.mark.parametrize("case", S.NEGATIVE)
def test_no_spike_where_nothing_is_a_tail_spike(case: str, tmp_path: Path) -> None:
    S.check_negative(case, SEED, tmp_path)


@pytest.mark.parametrize("name", [S.known_miss(n, SEED, S.KNOWN_QUARTER_MISSES) for n in S.INCIDENTS])
def test_every_incident_is_still_found_at_a_quarter(name: str, tmp_path: Path) -> None:
    S.check_quarter(name, SEED, tmp_path)
