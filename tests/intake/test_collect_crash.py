"""kill -9 under load: every acknowledged span is stored, none twice after restart and re-send.

Each trial runs `tailscope collect` as a child process, posts bodies over several
connections, SIGKILLs it in the middle of the load (once the client has seen a random number
of its bodies acknowledged, between one and all but one), restarts it on the same store and
re-sends every body of the trial (acknowledged or not). Afterwards the store must hold every
span the client saw acknowledged, every span exactly once, and only complete segments.

The kill follows the load's progress, not the clock: a kill at a random moment of a fixed
time window landed before the first acknowledgement or after the last in 11 of 20 trials on
a loaded machine (sooner or later on another machine), trials that re-test only a restart. A
kill mid-load reaches both of those trials' states at once (bodies in flight, unacknowledged;
bodies acknowledged from the journal and not yet in a segment), so every trial here is one of
the 9 of 20 that mattered, and 10 trials kill mid-load more often than 20 timed ones did.
Each trial's cost is mostly its receiver's start (about 0.7 CPU-seconds of imports).
"""

from __future__ import annotations

import asyncio
import random
import re
import signal
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from analysis.engine.connect import connect
from intake.collect.journal import JOURNAL_DIR
from tests.intake.collect_helpers import pb_body, start_cli_receiver
from tests.sql import one
from tracing.store import segment_files

pytestmark = pytest.mark.slow  # an end-to-end run (CONTRIBUTING.md: make test-fast leaves it out)

TRIALS = 10
#: the journal (the default since it is on again; explicit so these trials exercise it whatever the default)
JOURNAL = ("--journal-ms", "250")
BODIES_PER_TRIAL = 24
SPANS_PER_BODY = 200


async def _post(port: int, bodies: list[bytes], acked: set[int], order: list[int],
                on_ack: Callable[[], None] = lambda: None) -> None:
    """Post bodies (indices from the shared `order`) until done or the connection dies; `on_ack` after each
    acknowledgement."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return
    try:
        while order:
            i = order.pop()
            body = bodies[i]
            writer.write(f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                         f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            status = int((await reader.readline()).split()[1])
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            if status == 200:
                acked.add(i)
                on_ack()
    except (OSError, IndexError, ValueError, asyncio.IncompleteReadError):
        return
    finally:
        writer.close()


async def _load_then_kill(port: int, bodies: list[bytes], kill_at_acks: int, kill: Callable[[], None]) -> set[int]:
    """Post `bodies` over 4 connections and `kill()` the receiver as the `kill_at_acks`-th acknowledgement comes
    in (the other connections' bodies in flight); the bodies acknowledged before the connections died."""
    acked: set[int] = set()
    killed: list[bool] = []

    def on_ack() -> None:
        if len(acked) >= kill_at_acks and not killed:
            killed.append(True)
            kill()

    order = list(range(len(bodies)))
    tasks = [asyncio.create_task(_post(port, bodies, acked, order, on_ack)) for _ in range(4)]
    await asyncio.wait(tasks, timeout=60)
    if not killed:  # fewer acknowledgements than asked for (a refusal): the kill still comes, after the load
        kill()
    await asyncio.wait(tasks, timeout=30)
    return acked


async def _resend(port: int, bodies: list[bytes]) -> set[int]:
    acked: set[int] = set()
    order = list(range(len(bodies)))
    await asyncio.wait_for(asyncio.gather(*(_post(port, bodies, acked, order) for _ in range(4))), 120)
    return acked


def test_sigkill_loses_no_acknowledged_span_and_stores_none_twice(tmp_path: Path) -> None:
    store = tmp_path / "store"
    rng = random.Random(20261201)
    all_keys: set[tuple[str, str]] = set()
    acked_keys: set[tuple[str, str]] = set()
    acked_before_kill = 0
    journalled = 0  # journal files left after a restart: must be none (replayed, then deleted)
    proc, port = start_cli_receiver(store, *JOURNAL)
    try:
        for _trial in range(TRIALS):
            made = [pb_body(SPANS_PER_BODY, rng) for _ in range(BODIES_PER_TRIAL)]
            bodies = [b for b, _ in made]
            for _, keys in made:
                all_keys.update(keys)
            victim = proc
            acked = asyncio.run(_load_then_kill(port, bodies, rng.randint(1, BODIES_PER_TRIAL - 1),
                                                partial(victim.send_signal, signal.SIGKILL)))
            victim.wait(30)
            acked_before_kill += len(acked)
            for i in acked:
                acked_keys.update(made[i][1])
            # restart: spans answered from the journal are stored before the receiver listens, so every
            # acknowledged span is there before any re-send; then re-send everything of this trial
            # (nothing may be stored twice). The restarted receiver is the next trial's victim
            proc, port = start_cli_receiver(store, *JOURNAL)
            journalled += len(list((store / JOURNAL_DIR).glob("*.journal")))
            con = connect(store)
            present = {tuple(r) for r in con.execute("SELECT TraceId, SpanId FROM spans").fetchall()}
            con.close()
            assert acked_keys <= present
            assert asyncio.run(_resend(port, bodies)) == set(range(len(bodies)))
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    con = connect(store)
    total, distinct = one(con, "SELECT count(*), count(DISTINCT (TraceId, SpanId)) FROM spans")
    stored_keys = {tuple(r) for r in con.execute("SELECT TraceId, SpanId FROM spans").fetchall()}
    con.close()
    assert stored_keys == all_keys
    assert total == distinct == len(all_keys)
    assert journalled == 0
    # the journal was exercised: some acknowledged spans were stored only by a restart's replay
    replayed = [re.search(r"journal: .* ([\d,]+) of them stored now", log.read_text())
                for log in tmp_path.glob("collect-*.log")]
    assert sum(int(m.group(1).replace(",", "")) for m in replayed if m) > 0
    # only complete segments are visible (temporary files are hidden names that do not match the glob)
    for path in segment_files(store):
        assert not path.name.startswith(".")
        pq.read_metadata(path)
    assert acked_before_kill > 0  # the kills did land under load, not only before it began
    assert acked_before_kill < TRIALS * BODIES_PER_TRIAL  # and not only after it ended
