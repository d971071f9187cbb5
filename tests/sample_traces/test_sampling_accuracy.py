"""Sampled traces give the unsampled answers: a committed catalogue sample (the whole fleet, 100 % kept) is
sampled by the rules real samplers follow (OpenTelemetry consistent probability sampling, the threshold
recorded as `ot=th`) and the weighted analysis of the copy is checked against the analysis of the whole.

- Counts, p50 and p99 per window and per tenant: the whole's value must lie within the copy's 99 %
  interval (the bootstrap of `analysis.sampling.quantile_interval` for percentiles; for counts the
  normal interval of the sampling design itself, variance sum (1 - p) / p over the whole's requests,
  which the test knows: an interval estimated from the copy is empty when it kept no error at all), wherever the copy's figure is not flagged low-sample. A 99 % interval misses 1 %
  of the time when calibrated; the bootstrap of a quantile from a few hundred values is known to run a
  little narrow, so at most MAX_MISS_SHARE of the checks may miss. The same checks on the copy read
  *without* weights must fail (the premise: sampling moved the answers).
- Every catalogue incident is still found at 25 % uniform sampling (the accuracy suite's rules).
- A tail-sampled copy (every slow or failed request kept, nothing recorded) is flagged, with its bias.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from analysis import connect
from analysis.percentiles import percentile_series
from analysis.report import build_report
from analysis.sampling import quantile_interval
from intake.ingest import ingest_files
from sample_traces import generate
from sample_traces.incidents import CATALOGUE
from tests.sample_traces import sampled_copy as C
from tests.sample_traces.test_accuracy import _accepted, _bounds_hold, _overlaps, _summary, truth

#: Share of interval checks allowed to miss (99 % intervals; see the module docstring).
MAX_MISS_SHARE = 0.05
#: z of a two-sided 99 % normal interval (counts).
Z99 = 2.5758
WINDOW_S = 120
NS = 1_000_000_000

POLICIES: dict[str, Callable[[dict[str, Any]], float]] = {
    "uniform_10": lambda r: 0.10,
    "errors_all_ok_20": lambda r: 1.0 if r["Outcome"] != "ok" else 0.20,
    "per_tenant": lambda r: {"acme": 0.10, "globex": 0.5, "initech": 0.25, "umbrella": 0.2}.get(r["Tenant"], 1.0),
}


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pa.Table]:
    store = tmp_path_factory.mktemp("whole") / "store"
    ingest_files([generate.traces_path(generate.INCIDENTS_DIR, "slow_replica")], store)
    return store, C.read_spans(store)


def _cells(frame: pl.DataFrame, by: list[str]) -> dict[tuple[Any, ...], dict[str, Any]]:
    return {(r["window_start_ns"], *(r[b] for b in by)): r for r in frame.iter_rows(named=True)}


def _checks(truth_store: Path, copy_store: Path, weighted: bool, keep_p: Callable[[dict[str, Any]], float]
            ) -> tuple[int, list[str]]:
    """(checks made, misses) of the copy's intervals against the whole's figures, per window and per tenant."""
    con_t, con_c = connect(truth_store), connect(copy_store)
    whole = C.facts(con_t)
    w_starts = np.array([r["start_ns"] for r in whole])
    w_tenants = np.array([r["tenant"] for r in whole], dtype=object)
    w_status = np.array([r["status"] for r in whole], dtype=object)
    p = np.array([keep_p({"Outcome": r["status"], "Tenant": r["tenant"]}) for r in whole])
    rows = C.facts(con_c)
    values = np.array([r["e2e_ns"] for r in rows], dtype=np.float64)
    weights = np.array([r["adjusted_count"] for r in rows]) if weighted else np.ones(len(rows))
    starts = np.array([r["start_ns"] for r in rows])
    tenants = np.array([r["tenant"] for r in rows], dtype=object)
    made, misses = 0, []
    if not weighted:  # the copy read as if every request stood for itself
        con_c.execute("CREATE TEMP TABLE plain AS SELECT * REPLACE (1.0 AS adjusted_count) FROM requests")
    for by, window in (([], WINDOW_S), (["tenant"], 600)):
        t_cells = _cells(percentile_series(con_t, "e2e", window_s=window, by=by), by)
        c_cells = _cells(percentile_series(con_c, "e2e", window_s=window, by=by,
                                           source=None if weighted else "plain"), by)
        for key, c in c_cells.items():
            t = t_cells[key]
            sel = (starts // (window * NS)) * (window * NS) == key[0]
            if by:
                sel &= tenants == key[1]
            w, v = weights[sel], values[sel]
            in_whole = (w_starts // (window * NS)) * (window * NS) == key[0]
            if by:
                in_whole &= w_tenants == key[1]
            for count, status in (("requests", None), ("errors", "error")):
                got = c[f"{count}_weighted"]
                m = in_whole if status is None else in_whole & (w_status == status)
                half = Z99 * math.sqrt(float(((1 - p[m]) / p[m]).sum())) + 1e-9
                made += 1
                if abs(got - t[count]) > half:
                    misses.append(f"{key} {count}: truth {t[count]}, copy {got:.1f} +- {half:.1f}")
            order = np.argsort(v, kind="stable")
            for name, q in (("p50", 0.5), ("p99", 0.99)):
                if c[f"{name}_low_sample"] or t[f"{name}_ms"] is None:
                    continue
                lo, hi = quantile_interval(v[order], w[order], q, seed=len(misses) + made)
                made += 1
                if not lo / 1e6 <= t[f"{name}_ms"] <= hi / 1e6:
                    misses.append(f"{key} {name}: truth {t[f'{name}_ms']:.1f}, copy {c[f'{name}_ms']:.1f} "
                                  f"in [{lo / 1e6:.1f}, {hi / 1e6:.1f}]")
    con_t.close()
    con_c.close()
    return made, misses


@pytest.mark.parametrize("policy", POLICIES)
def test_weighted_counts_and_percentiles_match_the_whole(policy: str, whole: tuple[Path, pa.Table],
                                                         tmp_path: Path) -> None:
    store, spans = whole
    copy = C.write_store(tmp_path / "copy", C.consistent_sample(spans, POLICIES[policy]))
    made, misses = _checks(store, copy, True, POLICIES[policy])
    assert made >= 40, made
    assert len(misses) <= MAX_MISS_SHARE * made, f"{policy}: {len(misses)} of {made} missed: {misses}"
    made_plain, misses_plain = _checks(store, copy, False, POLICIES[policy])  # the premise: unweighted, it is wrong
    assert len(misses_plain) > MAX_MISS_SHARE * made_plain, f"{policy}: unweighted copy passed too"
