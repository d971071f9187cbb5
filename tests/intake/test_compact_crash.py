"""kill -9 during compaction: no span lost, none doubled, and a reader looping over the hour always counts the same.

The suite runs 8 trials; `TAILSCOPE_COMPACT_CRASH_TRIALS=20 .venv/bin/pytest tests/intake/test_compact_crash.py`
runs 20 (docs/collect.md, "What happens to files"). Each trial kills a compactor running as `collect` runs it (both
merge lanes) while a writer adds segments to another hour and a reader counts the hour being merged.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq

from intake.compact.merge import Compactor, Policy
from tests.intake.collect_helpers import ROOT
from tests.intake.compact_helpers import keys, random_batch, rows, write_segments
from tests.sql import one
from tracing.store import SegmentWriter, hour_dirs, init_store, list_hour, segment_files

TRIALS = int(os.environ.get("TAILSCOPE_COMPACT_CRASH_TRIALS", "8"))
GRACE_S = 3.0  # longer than a reader's list-then-read; the trials delete merged segments of earlier ones
#: the child: imports done, it says so, then compacts with both lanes (fan-in 4, so several merges commit)
#: until a pass finds nothing to do; argv: store, grace, quiet (0: the hour is settled; large: still written)
CHILD = ("import sys, time\n"
         "from pathlib import Path\n"
         "from intake.compact.merge import Compactor, Policy, start_background\n"
         "c = Compactor(Path(sys.argv[1]), Policy(fan_in=4, quiet_s=float(sys.argv[3]), grace_s=float(sys.argv[2]), "
         "target_bytes=1 << 20))\n"
         "c.acquire()\n"
         "print('ready', flush=True)\n"
         "thread, stop = start_background(c, 0.02)\n"
         "for _ in range(6000):\n"
         "    if c.idle_since is not None:\n"
         "        break\n"
         "    time.sleep(0.01)\n"
         "stop.set()\n"
         "thread.join()\n"
         "print('done', flush=True)\n")


def _reader(hour: Path, expect: int, go: threading.Event, stop: threading.Event, seen: list[int],
            errors: list[str]) -> None:
    """Count the hour's rows over and over, from `go` (the compactor about to start; a count never pauses, so
    counting the untouched hour while the child imports would only take CPU from it) until `stop`."""
    con = duckdb.connect()
    go.wait(60)
    for _ in range(100_000):  # bounded; ends when the trial does
        if stop.is_set():
            return
        files = [str(f) for f in list_hour(hour).files]
        try:
            (n,) = one(con, "SELECT count(*) FROM read_parquet(?)", [files])
        except duckdb.Error as exc:
            errors.append(str(exc).splitlines()[0])
            return
        seen.append(n)
        if n != expect:
            errors.append(f"counted {n}, expected {expect}")
            return


def _writer(store: Path, rng: random.Random, trial: int, stop: threading.Event, wrote: Counter[Any]) -> None:
    """Load: segments of another hour landing while the compactor runs (bounded); their keys go to `wrote`."""
    writer = SegmentWriter(store, kind="load")
    for k in range(200):
        if stop.wait(0.02):
            return
        table = random_batch(rng, rng.randint(1, 20), 1, ("load", trial, k)).to_table()
        writer.write(table)
        wrote.update(zip(table.column("TraceId").to_pylist(), table.column("SpanId").to_pylist(), strict=True))


def test_kill_9_during_compaction_loses_and_doubles_nothing(tmp_path: Path) -> None:
    rng = random.Random(11)
    store = init_store(tmp_path / "store")
    killed, counts = 0, 0
    for trial in range(TRIALS):
        write_segments(store, rng, 24, tag=trial, max_spans=60)
        hour = hour_dirs(store)[0]  # hour 0: the one merged, no new spans during the trial
        before = keys(store)
        expect = sum(pq.read_metadata(f).num_rows for f in list_hour(hour).files)
        seen: list[int] = []
        errors: list[str] = []
        go, stop, wrote = threading.Event(), threading.Event(), Counter[tuple[str, str]]()
        reader = threading.Thread(target=_reader, args=(hour, expect, go, stop, seen, errors))
        writer = threading.Thread(target=_writer, args=(store, random.Random(trial), trial, stop, wrote))
        reader.start()
        writer.start()
        quiet = "0" if trial % 2 else "3600"  # odd trials: the settled merge; even ones: levels, both lanes
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(store), str(GRACE_S), quiet], cwd=ROOT,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        go.set()  # the reader counts from here: while the child imported, the hour could not change
        time.sleep(rng.uniform(0.0, 0.3))  # somewhere in the pass: reading, writing, renaming, deleting
        if child.poll() is None:
            child.kill()
            killed += 1
        child.wait()
        time.sleep(0.2)  # the reader goes on over what the killed compactor left
        stop.set()
        reader.join(60)
        writer.join(60)
        assert errors == [], f"trial {trial}: {errors}"
        assert seen, "the reader never ran"
        counts += len(seen)
        assert keys(store) == before + wrote, f"trial {trial}: spans lost or doubled"
    assert killed >= 3, "the kills never landed while the compactor ran: make the trials longer"
    print(f"{TRIALS} trials, {killed} kill -9 while the compactor ran; the reader counted {counts} times, "
          "always the same; no span lost or doubled")
    # a last compactor finishes everything; the merged segments' grace over, they go
    before_rows, before = rows(store), keys(store)
    with Compactor(store, Policy(quiet_s=0, grace_s=GRACE_S, target_bytes=1 << 20, durable=False)) as c:
        c.run_once(time.time() + 3600)
        c.run_once(time.time() + 7200)
    assert rows(store) == before_rows  # every column of every span
    assert keys(store) == before
    assert all(n == 1 for n in keys(store).values())
    on_disk = sorted(p.name for p in (store / "spans").rglob("*.parquet"))
    assert on_disk == sorted(f.name for f in segment_files(store))  # nothing hidden left behind
    assert not [p for p in store.rglob("*") if p.name.endswith(".ctmp")]
