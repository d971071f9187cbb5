"""The accuracy suite and the quarter-sampling check on seed 5 (tests/sample_traces/seeded.py: runs and rules)."""

import pytest

from tests.sample_traces import seeded

pytestmark = pytest.mark.slow  # simulated fleets reported (make test-fast leaves it out)

(test_every_catalogue_entry_is_judged_right, test_no_spike_where_nothing_is_a_tail_spike,
 test_every_incident_is_still_found_at_a_quarter) = seeded.seed_tests(5)
