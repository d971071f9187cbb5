"""Benchmark of `report --engine clickhouse` on older ClickHouse releases against the newest, same run, same spans.

The store is benchmarks.bench_report's synthetic one. Each release is served over ClickHouse's
HTTP interface by tests/clickhouse_http.py (the newest: this venv's chdb; an older one: the chdb
of `.venv-ch/<release>`, `make ch-releases`), the store exported into it through our
`clickhouse://` client, and the report run through that client; every report must equal the
newest's (and DuckDB's on the store).

    python -m benchmarks.bench_clickhouse_releases [--spans 1000000] [--releases 24.8,25.8] [--json]

Prints per release: its version(), the export time, the report time and its ratio to the newest
release's report time (the anchor: measured first and again last in the same run, their mean), and
the 1-minute load.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_clickhouse import without_export_keys
from benchmarks.bench_report import make_store


def _one(release: str, store: Path, root: Path) -> dict[str, Any]:
    from analysis import clickhouse as C
    from analysis.clickhouse.export import export_store
    from analysis.clickhouse.report import build_report
    from tests.analysis.clickhouse_releases import serve

    with serve(release, root / f"ch-{release}") as srv:
        client = C.open_client(srv.dsn + "?timeout=3600")
        try:
            t = time.perf_counter()
            export_store(store, client, C.DEFAULT_TABLE)
            export_s = time.perf_counter() - t
            t = time.perf_counter()
            report = build_report(client, C.DEFAULT_TABLE, materialized=False)
            report_s = time.perf_counter() - t
        finally:
            client.close()
    return {"release": release, "version": srv.version, "export_s": round(export_s, 2),
            "report_s": round(report_s, 2), "report": report}


def main(argv: list[str] | None = None) -> None:
    """Run the report on each release and the newest (the anchor); print the times, their ratio and the load."""
    from analysis.engine.connect import connect
    from analysis.report import build_report
    from tests.analysis.clickhouse_releases import NEWEST

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", type=int, default=1_000_000)
    ap.add_argument("--releases", default="24.8,25.8", help="older releases, comma-separated (.venv-ch/<release>)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-ch-rel-") as tmp:
        root = Path(tmp)
        make_store(root / "store", a.spans)
        duck = build_report(connect(root / "store"))
        first = _one(NEWEST, root / "store", root)
        older = [_one(r.strip(), root / "store", root) for r in a.releases.split(",") if r.strip()]
        last = _one(NEWEST, root / "store", root)  # the anchor again after the others: the load drifts
        anchor = {**first, "report_s": round((first["report_s"] + last["report_s"]) / 2, 2),
                  "export_s": round((first["export_s"] + last["export_s"]) / 2, 2)}
        assert last["report"] == first["report"]
        rows = [anchor, *older]
    out = []
    for r in rows:
        out.append({k: v for k, v in r.items() if k != "report"} | {
            "ratio_to_newest": round(r["report_s"] / anchor["report_s"], 2),
            "equal_to_newest": r["report"] == anchor["report"],
            # the synthetic store keeps the built-ins in columns only; the export writes them into the maps too
            "equal_to_duckdb": without_export_keys(r["report"]) == without_export_keys(duck)})
    load = round(os.getloadavg()[0], 1)
    if a.json:
        print(json.dumps({"spans": a.spans, "load_1min": load, "releases": out}))
        return
    print(f"spans {a.spans:,}  load(1 min) {load}")
    for r in out:
        print(f"{r['release']:>7} ({r['version']}): export {r['export_s']} s, report {r['report_s']} s, "
              f"x{r['ratio_to_newest']} the newest; equal to the newest {r['equal_to_newest']}, "
              f"to DuckDB (the export's keys aside) {r['equal_to_duckdb']}")


if __name__ == "__main__":
    main()
