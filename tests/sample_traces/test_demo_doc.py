"""docs/demo.md's catalogue table shows the effects the truth files record (nothing copied by hand goes stale)."""

from __future__ import annotations

import json
import re
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

from sample_traces import generate
from sample_traces.incidents import CATALOGUE

DOC = Path(__file__).resolve().parents[2] / "docs" / "demo.md"


def _ms(value: float) -> str:
    """A truth file's milliseconds as the table writes them: whole, rounded half up, with thousands commas."""
    return f"{int(Decimal(str(value)).quantize(Decimal(1), rounding=ROUND_HALF_UP)):,}"


def test_the_catalogue_table_has_each_incident_with_its_truth_files_effect() -> None:
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)` \|.*$", DOC.read_text(), re.M)}
    assert set(rows) == {inc.name for inc in CATALOGUE}
    for inc in CATALOGUE:
        truth = json.loads(generate.truth_path(generate.INCIDENTS_DIR, inc.name).read_text())
        cells = [c.strip() for c in rows[inc.name].strip("|").split("|")]
        if "effect" not in truth:
            assert cells[-2:] == ["-", "-"], inc.name
            continue
        clean, incident = truth["effect"]["clean"], truth["effect"]["incident"]
        assert cells[2:] == [truth["stage"], f"{truth['dimension']} = {truth['value']}",
                             f"{_ms(clean['p50_ms'])} → {_ms(incident['p50_ms'])}",
                             f"{_ms(clean['p99_ms'])} → {_ms(incident['p99_ms'])}"], inc.name
