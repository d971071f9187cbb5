"""`tailscope report --json` of this tree against another git ref, on the same stores, in the same run.

The ref's tree is exported (git archive) into a temporary directory and its optional C parts built
there, so both trees run as installed from source. Then, on each store, `python -m tailscope report
--store S --json --no-materialize` runs with each tree in a fresh process, alternating (this, ref, ref,
this, ...: both see the same machine load): the median wall and CPU seconds of each, and their ratio
(this / ref). The stores, built once by this tree and read by both (never written: --no-materialize):

- the catalogue: every sample under sample_traces/data (incidents, engines, demo, basic), ingested;
- a synthetic store of --spans spans (benchmarks.synthetic), built or reused by fingerprint (benchmarks.inputs).

Outputs are compared byte for byte ("identical"), and when they differ, again with the keys newer
versions of the contract added removed (ADDITIVE_TOP: the report's `attributes` object;
ADDITIVE_DIMENSION: the `attribute`, `source`, `finer` and `coarser` keys of each dimension and
condition), since version 1 only grows. Where they differ even so, the names of the keys that differ
are printed beside the store (say, `candidates_tested` and `p_value` when the tests counted changed).
`--this REF` measures another ref instead of the working tree (to find which change moved a figure).

    python -m benchmarks.bench_against --ref c77bc9d [--this REF] [--spans 1000000] [--runs 3] [--dir DIR]
        [--catalogue-only] [--samples basic.otlp.jsonl.gz,...] [--no-c]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.inputs import prepare
from benchmarks.synthetic import make_store

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces" / "data"
#: keys later contract versions added: the top-level object, and those of each dimension, condition and level
ADDITIVE_TOP = ("attributes",)
ADDITIVE_DIMENSION = ("attribute", "source", "finer", "coarser")
#: runs the CLI of the tree it is given (argv[1]) and fails when a module of ours came from elsewhere (an editable
#: install of another tree fills in a module the tree lacks: that run would measure a mix of trees)
RUNNER = """
import os, runpy, sys
tree = os.path.realpath(sys.argv[1]) + os.sep
sys.argv = ["tailscope", *sys.argv[2:]]
try:
    runpy.run_module("tailscope", run_name="__main__", alter_sys=True)
finally:
    ours = ("tracing", "intake", "analysis", "dashboard", "tailscope", "sample_traces")
    bad = sorted(n for n, m in list(sys.modules.items()) if n.split(".")[0] in ours
                 and getattr(m, "__file__", None) and not os.path.realpath(m.__file__).startswith(tree))
    if bad:
        sys.stderr.write("modules from outside the tree: " + ", ".join(bad) + "\\n")
        os._exit(3)
"""


def ingest_sample(store: Path, sample: str) -> None:
    """A store holding one catalogue sample (a path under sample_traces/data), as `tailscope ingest` leaves it."""
    from intake.ingest import ingest_files

    ingest_files([SAMPLES / sample], store)


def catalogue() -> list[str]:
    """Every sample of the catalogue, relative to sample_traces/data."""
    return sorted(str(p.relative_to(SAMPLES)) for p in SAMPLES.rglob("*.otlp.jsonl.gz"))


def export_tree(ref: str, into: Path, build: bool = True) -> Path:
    """The files of `ref` (git archive of this repository) under `into`, its optional C parts built in place
    (unless not `build`)."""
    archive = subprocess.run(["git", "archive", "--format=tar", ref], cwd=ROOT, check=True, capture_output=True)
    with tempfile.TemporaryFile() as fh:
        fh.write(archive.stdout)
        fh.seek(0)
        with tarfile.open(fileobj=fh) as tar:
            tar.extractall(into, filter="data")
    if build and (into / "setup.py").is_file():
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=into, check=True,
                       capture_output=True)
    return into


def strip_additive(report: Any) -> Any:
    """The report without the keys later versions added (ADDITIVE_TOP, ADDITIVE_DIMENSION wherever a dimension
    or condition is)."""
    out = {k: v for k, v in report.items() if k not in ADDITIVE_TOP}

    def dim(d: dict[str, Any]) -> dict[str, Any]:
        d = {k: v for k, v in d.items() if k not in ADDITIVE_DIMENSION}
        if "conditions" in d:
            d["conditions"] = [dim(x) for x in d["conditions"]]
        return d

    out["spikes"] = [{**s, "dimensions": [dim(d) for d in s.get("dimensions", [])]} for s in report["spikes"]]
    return out


def differing_keys(a: Any, b: Any, key: str = "") -> set[str]:
    """The names of the keys whose values differ between two JSON values (list items compared in order)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return set().union(*(differing_keys(a.get(k), b.get(k), k) for k in a.keys() | b.keys()))
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return set().union(*(differing_keys(x, y, key) for x, y in zip(a, b, strict=True)))
    return set() if a == b else {key or "(whole)"}


def _children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def report_once(tree: Path, store: Path) -> tuple[str, float, float]:
    """(stdout, wall s, CPU s) of `tailscope report --json` on `store` with the source tree `tree`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TAILSCOPE_")}  # the settings at their defaults
    env["PYTHONPATH"] = str(tree)
    t, c = time.perf_counter(), _children_cpu_s()
    done = subprocess.run([sys.executable, "-c", RUNNER, str(tree), "report", "--store", str(store), "--json",
                           "--no-materialize"], cwd=tree, env=env, capture_output=True, text=True, check=False)
    wall, cpu = time.perf_counter() - t, _children_cpu_s() - c
    if done.returncode != 0:
        raise SystemExit(f"{tree}: report on {store} failed: {done.stderr.strip().splitlines()[-1:]}")
    return done.stdout, wall, cpu


def compare(store: Path, trees: dict[str, Path], runs: int) -> dict[str, Any]:
    """Both trees on one store, alternating (ABBA...): medians, ratios, and whether the outputs agree."""
    names = list(trees)
    times: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    outputs: dict[str, set[str]] = {n: set() for n in names}
    for i in range(runs):
        for name in (names if i % 2 == 0 else names[::-1]):
            out, wall, cpu = report_once(trees[name], store)
            times[name].append((wall, cpu))
            outputs[name].add(out)
    row: dict[str, Any] = {"store": store.name}
    for name in names:
        row[f"{name}_wall_s"] = round(statistics.median(w for w, _ in times[name]), 3)
        row[f"{name}_cpu_s"] = round(statistics.median(c for _, c in times[name]), 3)
    this, ref = names
    row["wall_x"] = round(row[f"{this}_wall_s"] / row[f"{ref}_wall_s"], 3)
    row["cpu_x"] = round(row[f"{this}_cpu_s"] / row[f"{ref}_cpu_s"], 3)
    row["deterministic"] = all(len(outputs[n]) == 1 for n in names)
    a, b = (next(iter(outputs[n])) for n in names)
    row["identical"] = a == b
    row["differs_in"] = sorted(differing_keys(strip_additive(json.loads(a)), strip_additive(json.loads(b))))
    row["equal_without_additive"] = not row["differs_in"]
    return row


def stores(args: argparse.Namespace, base: Path) -> Iterator[Path]:
    """The catalogue's stores and the synthetic one, built (or reused) under `base`."""
    for sample in args.samples.split(",") if args.samples else catalogue():
        store = base / ("sample-" + sample.replace("/", "-").removesuffix(".otlp.jsonl.gz"))
        prepare(store, ingest_sample, sample=sample)
        yield store
    if not args.catalogue_only:
        for spans in (int(s) for s in args.spans.split(",")):
            store = base / f"store-{spans}"
            prepare(store, make_store, spans=spans)
            yield store


def main(argv: list[str] | None = None) -> None:
    """Export the ref, build or reuse the stores, run both trees alternating and print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--ref", default="c77bc9d", help="the git ref to compare with (default: %(default)s)")
    parser.add_argument("--this", default=None, help="a git ref to measure instead of this working tree")
    parser.add_argument("--spans", default="1000000", help="synthetic store sizes, comma-separated")
    parser.add_argument("--runs", type=int, default=3, help="runs of each tree on each synthetic store")
    parser.add_argument("--catalogue-runs", type=int, default=1, help="runs of each tree on each catalogue store")
    parser.add_argument("--catalogue-only", action="store_true", help="no synthetic store")
    parser.add_argument("--samples", default=None,
                        help="comma-separated catalogue samples (paths under sample_traces/data; default: every one)")
    parser.add_argument("--no-c", action="store_true", help="leave the ref's optional C parts unbuilt")
    parser.add_argument("--dir", default=None, help="where the stores live (default: a temp dir)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="tailscope-against-"))
    def short(ref: str) -> str:
        return subprocess.run(["git", "rev-parse", "--short", ref], cwd=ROOT, check=True, capture_output=True,
                              text=True).stdout.strip()

    rows = []
    with tempfile.TemporaryDirectory(prefix="tailscope-ref-") as tmp:
        this = ROOT if args.this is None else export_tree(args.this, Path(tmp) / "this", not args.no_c)
        trees = {"this": this, "ref": export_tree(args.ref, Path(tmp) / "ref", not args.no_c)}
        for store in stores(args, base):
            runs = args.runs if store.name.startswith("store-") else args.catalogue_runs
            rows.append(compare(store, trees, runs))
    cat = [r for r in rows if r["store"].startswith("sample-")]
    summary = {"this": "working tree" if args.this is None else f"{args.this} ({short(args.this)})",
               "ref": f"{args.ref} ({short(args.ref)})", "stores": len(rows),
               "identical": sum(r["identical"] for r in rows),
               "equal_without_additive": sum(r["equal_without_additive"] for r in rows),
               "catalogue_cpu_x": round(sum(r["this_cpu_s"] for r in cat) / max(sum(r["ref_cpu_s"] for r in cat),
                                                                             1e-9), 3) if cat else None,
               "loadavg_1m": round(os.getloadavg()[0], 2)}
    if args.json:
        print(json.dumps({"rows": rows, "summary": summary}, indent=2))
    else:
        print(f"{'store':44} {'this wall':>9} {'ref wall':>9} {'wall x':>7} {'this cpu':>9} {'ref cpu':>9} "
              f"{'cpu x':>6}  identical  equal w/o additive keys")
        for r in rows:
            differs = f" ({', '.join(r['differs_in'])})" if r["differs_in"] else ""
            print(f"{r['store']:44} {r['this_wall_s']:9.2f} {r['ref_wall_s']:9.2f} {r['wall_x']:7.3f} "
                  f"{r['this_cpu_s']:9.2f} {r['ref_cpu_s']:9.2f} {r['cpu_x']:6.3f}  {r['identical']!s:9}  "
                  f"{r['equal_without_additive']}{differs}")
        print("summary:", " ".join(f"{k}={v}" for k, v in summary.items()))
        print(f"compared without the keys later contract versions added: {', '.join(ADDITIVE_TOP)} (top level); "
              f"{', '.join(ADDITIVE_DIMENSION)} (each dimension and condition)")
    differ = [r["store"] for r in rows if not r["equal_without_additive"]]
    if differ:
        print(f"reports differ from {args.ref} even without the additive keys on {len(differ)} store(s); the keys "
              "that differ are listed beside each")


if __name__ == "__main__":
    main()
