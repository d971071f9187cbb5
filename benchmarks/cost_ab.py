"""Before / after for `tailscope cost` and the capacity curve: run once per source tree, then compare.

    PYTHONPATH=OLD_TREE python -m benchmarks.cost_ab --store STORE --out old.json
    PYTHONPATH=NEW_TREE python -m benchmarks.cost_ab --store STORE --out new.json
    python -m benchmarks.cost_ab --compare old.json new.json
    python -m benchmarks.cost_ab --spans 1000000 [--dir DIR] --out this.json   # benchmarks.synthetic's store

Times (wall and CPU seconds) the cost table by tenant (priced), the observed workload, the
1-64 replica curve and the same curve with another target on the same workload, with
whatever `analysis` is importable; `--compare` prints both and says whether the results are
the same (integer GPU ns exactly; USD within float rounding; every curve point exactly).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _timed(out: dict[str, Any], name: str, fn: Any) -> Any:
    w0, c0 = time.perf_counter(), _cpu()
    value = fn()
    out[f"{name}_s"], out[f"{name}_cpu_s"] = round(time.perf_counter() - w0, 2), round(_cpu() - c0, 2)
    return value


def measure(store: Path) -> dict[str, Any]:
    """The figures and results of the importable `analysis` on `store`."""
    from analysis import connect
    from analysis.capacity import capacity_curve, observed_workload
    from analysis.cost import Prices, cost_table

    res: dict[str, Any] = {"load_before": os.getloadavg()[0]}
    con = connect(store, memory_limit="4GB")
    con.execute("SET enable_progress_bar = false")
    res["table"] = _timed(res, "cost", lambda: cost_table(con, by="tenant", prices=Prices(default=2.0)))
    con.close()
    con = connect(store, memory_limit="4GB")
    con.execute("SET enable_progress_bar = false")
    con.execute("CREATE TABLE req AS SELECT * FROM requests")
    con.execute("CREATE OR REPLACE TEMP VIEW requests AS SELECT * FROM req")
    w = _timed(res, "workload", lambda: observed_workload(con))
    curve = _timed(res, "curve", lambda: capacity_curve(w, range(1, 65), target_p99_ms=18000.0, gpu_hour_usd=2.0))
    _timed(res, "curve_new_target", lambda: capacity_curve(w, range(1, 65), target_p99_ms=30000.0,
                                                           gpu_hour_usd=2.0))
    res["curve"] = curve["points"]
    res["fewest"] = curve["fewest_replicas"]
    res["load_after"] = os.getloadavg()[0]
    return res


def _same_table(a: dict[str, Any], b: dict[str, Any]) -> bool:
    def close(x: Any, y: Any) -> bool:
        if isinstance(x, float) and isinstance(y, float):
            return math.isclose(x, y, rel_tol=1e-12)
        return bool(x == y)

    for ra, rb in zip(a["rows"], b["rows"], strict=True):
        if any(not close(ra[k], rb[k]) for k in ra):
            return False
    return a["replicas"] == b["replicas"] and all(close(a["totals"][k], b["totals"][k]) for k in a["totals"])


def main(argv: list[str] | None = None) -> None:
    """Measure one tree (--store, --out) or compare two outputs (--compare)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--store", help="the store to measure, as it is")
    parser.add_argument("--spans", type=int, default=None,
                        help="instead of --store: benchmarks.synthetic's store of this many spans under --dir")
    parser.add_argument("--dir", default=None, help="with --spans: where the store lives (default: a temp dir)")
    parser.add_argument("--out")
    parser.add_argument("--compare", nargs=2)
    args = parser.parse_args(argv)
    if args.compare:
        old, new = (json.loads(Path(p).read_text()) for p in args.compare)
        for name, r in (("before", old), ("after", new)):
            print(name, {k: v for k, v in r.items() if k not in ("table", "curve")})
        print("cost table the same:", _same_table(old["table"], new["table"]),
              "| curve the same:", old["curve"] == new["curve"])
        return
    if not (args.store or args.spans) or not args.out:
        parser.error("give --store (or --spans) and --out, or --compare OLD NEW")
    work = Path(args.dir or tempfile.mkdtemp(prefix="cost-ab-"))
    store = Path(args.store) if args.store else work / f"store-{args.spans}"
    if not args.store:  # by fingerprint (benchmarks.inputs), as its generator built it
        from benchmarks.inputs import prepare
        from benchmarks.synthetic import make_store

        prepare(store, make_store, spans=args.spans)
    res = measure(store)
    Path(args.out).write_text(json.dumps(res, indent=1, default=str))
    print({k: v for k, v in res.items() if k not in ("table", "curve")})


if __name__ == "__main__":
    main()
