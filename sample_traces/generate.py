"""Regenerate the committed samples deterministically from a seed.

    python -m sample_traces.generate            # every catalogue entry + the demo timeline
    python -m sample_traces.generate --only slow_replica --out samples

For each incident of the catalogue (and the clean run): `incidents/<name>.otlp.jsonl.gz`
(gzip OTLP/JSON lines, as the Collector's file exporter writes) and `<name>.truth.json`.
For the demo: `demo.otlp.jsonl.gz` (a 30-minute run with two incidents) and
`demo.truth.json`. The same seed gives the same files.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

from sample_traces.emit import write_otlp
from sample_traces.incidents import CATALOGUE, DEMO_RATE, run, run_timeline, write_truth

DATA_DIR = Path(__file__).parent / "data"
INCIDENTS_DIR = DATA_DIR / "incidents"
DEMO_TRACES = DATA_DIR / "demo.otlp.jsonl.gz"
DEMO_TRUTH = DATA_DIR / "demo.truth.json"
SEED = 1
#: Accuracy-suite runs: 10 minutes at 10 requests/s (about 6,000 requests each: a p99 per 60 s window needs hundreds).
DURATION_S = 600.0
RATE = 10.0


def traces_path(out_dir: Path, name: str) -> Path:
    """Where a catalogue entry's traces go under `out_dir`."""
    return out_dir / f"{name}.otlp.jsonl.gz"


def truth_path(out_dir: Path, name: str) -> Path:
    """Where a catalogue entry's truth file goes under `out_dir`."""
    return out_dir / f"{name}.truth.json"


def generate_incident(name: str, out_dir: Path = INCIDENTS_DIR, seed: int = SEED,
                      duration_s: float = DURATION_S, rate: float = RATE) -> tuple[Path, Path]:
    """Simulate one catalogue entry and write its traces and truth; returns both paths."""
    scenario = run(name, seed, duration_s, rate)
    traces = write_otlp(traces_path(out_dir, name), scenario.config, scenario.requests, seed)
    return traces, write_truth(truth_path(out_dir, name), scenario.truth())


def generate_demo(traces: Path = DEMO_TRACES, truth: Path = DEMO_TRUTH, seed: int = SEED,
                  rate: float = DEMO_RATE) -> tuple[Path, Path]:
    """Simulate the demo timeline (two incidents in 30 minutes) and write its traces and truth."""
    timeline = run_timeline(seed=seed, rate=rate)
    write_otlp(traces, timeline.config, timeline.requests, seed)
    truth.parent.mkdir(parents=True, exist_ok=True)
    return traces, write_truth(truth, timeline.truth())


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: regenerate the samples."""
    parser = argparse.ArgumentParser(prog="python -m sample_traces.generate", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DATA_DIR, help="data directory (default: the package's)")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--only", nargs="*", default=None,
                        help="catalogue entries to make (default: all), or 'demo'")
    args = parser.parse_args(argv)
    names = args.only if args.only is not None else [*(i.name for i in CATALOGUE), "demo"]
    for name in names:
        t = time.perf_counter()
        if name == "demo":
            paths = generate_demo(args.out / DEMO_TRACES.name, args.out / DEMO_TRUTH.name, args.seed)
        else:
            paths = generate_incident(name, args.out / INCIDENTS_DIR.name, args.seed)
        size = paths[0].stat().st_size
        print(f"{name}: {paths[0]} ({size / 1e6:.1f} MB), {paths[1].name} in {time.perf_counter() - t:.1f} s")


if __name__ == "__main__":
    main()
