"""kill -9 during compaction: no span lost, none doubled, and a reader looping over the hour always counts the same."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb

from intake.compact.merge import Compactor, Policy
from tests.intake.collect_helpers import ROOT
from tests.intake.compact_helpers import keys, rows, write_segments
from tracing.store import init_store, segment_files

TRIALS = 8
GRACE_S = 3.0  # longer than a reader's list-then-read; the trials delete merged segments of earlier ones
#: the child: imports done, it says so, then one compaction pass (fan-in 4, so a pass commits several merges)
CHILD = ("import sys, time\n"
         "from pathlib import Path\n"
         "from intake.compact.merge import Compactor, Policy\n"
         "c = Compactor(Path(sys.argv[1]), Policy(fan_in=4, quiet_s=0, grace_s=float(sys.argv[2]), "
         "target_bytes=1 << 20))\n"
         "c.acquire()\n"
         "print('ready', flush=True)\n"
         "c.run_once()\n"
         "print('done', flush=True)\n")


def _reader(store: Path, expect: int, stop: threading.Event, seen: list[int], errors: list[str]) -> None:
    con = duckdb.connect()
    for _ in range(100_000):  # bounded; ends when the trial does
        if stop.is_set():
            return
        files = [str(f) for f in segment_files(store)]
        try:
            (n,) = con.execute("SELECT count(*) FROM read_parquet(?)", [files]).fetchone()  # type: ignore[misc]
        except duckdb.Error as exc:
            errors.append(str(exc).splitlines()[0])
            return
        seen.append(n)
        if n != expect:
            errors.append(f"counted {n}, expected {expect}")
            return


def test_kill_9_during_compaction_loses_and_doubles_nothing(tmp_path: Path) -> None:
    rng = random.Random(11)
    store = init_store(tmp_path / "store")
    killed_mid_merge = 0
    for trial in range(TRIALS):
        write_segments(store, rng, 24, tag=trial, max_spans=60)
        before = keys(store)
        expect = sum(before.values())
        stop, seen, errors = threading.Event(), [], []  # type: ignore[var-annotated]
        reader = threading.Thread(target=_reader, args=(store, expect, stop, seen, errors))
        reader.start()
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(store), str(GRACE_S)], cwd=ROOT,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        time.sleep(rng.uniform(0.0, 0.3))  # somewhere in the pass: reading, writing, renaming, deleting
        if child.poll() is None:
            child.kill()
            killed_mid_merge += 1
        child.wait()
        time.sleep(0.2)  # the reader goes on over what the killed compactor left
        stop.set()
        reader.join(60)
        assert errors == [], f"trial {trial}: {errors}"
        assert seen, "the reader never ran"
        assert keys(store) == before, f"trial {trial}: spans changed"
    assert killed_mid_merge >= 3, "the kills never landed while the compactor ran: make the trials longer"
    # a last compactor finishes everything; the merged segments' grace over, they go
    before_rows = rows(store)
    with Compactor(store, Policy(quiet_s=0, grace_s=GRACE_S, target_bytes=1 << 20, durable=False)) as c:
        c.run_once(time.time() + 3600)
        c.run_once(time.time() + 7200)
    assert rows(store) == before_rows  # every column of every span
    assert keys(store) == before
    assert all(n == 1 for n in keys(store).values())
    on_disk = sorted(p.name for p in (store / "spans").rglob("*.parquet"))
    assert on_disk == sorted(f.name for f in segment_files(store))  # nothing hidden left behind
    assert not [p for p in store.rglob("*") if p.name.endswith(".ctmp")]
