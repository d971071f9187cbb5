"""The journal (intake/collect/journal.py): records read back exactly, torn tails ignored, answers given
before the segment, and a dead receiver's journal replayed so each acknowledged span is stored once."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from analysis.engine.connect import connect
from intake.collect.commit import Committer, RecentKeys
from intake.collect.journal import ARROW, PROTOBUF, Journal, encode_record, host_tag, journal_dir, read_journal
from intake.collect.recovery import replay_journals
from intake.engines import normalize
from intake.otlp import base_from_columns, decode_protobuf_base, new_builder, promote
from intake.peer import with_peer
from tests.intake.collect_helpers import pb_body
from tracing.store import SegmentWriter, init_store, segment_files


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _writer_name(pid: int) -> str:
    return f"collect-{host_tag()}-{pid}-0123abcd"


def _keys(store: Path) -> list[tuple[str, str]]:
    con = connect(store)
    try:
        return [tuple(r) for r in con.execute("SELECT TraceId, SpanId FROM spans").fetchall()]
    finally:
        con.close()


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as out:
        out.write_table(table)
    return sink.getvalue().to_pybytes()


def test_records_read_back_and_a_torn_or_corrupt_tail_ends_them(tmp_path: Path) -> None:
    rng = random.Random(7)
    payloads = [(PROTOBUF if i % 2 else ARROW, rng.choice([None, "10.0.0.1"]), rng.randbytes(rng.randrange(0, 300)))
                for i in range(20)]
    journal = Journal(tmp_path, _writer_name(_dead_pid()), durable=True)
    assert journal.append(3, 123_456, [encode_record(*p) for p in payloads])
    journal.close()
    path = journal.path(3)
    started, records = read_journal(path)
    assert started == 123_456
    assert [(r.kind, r.peer, r.payload) for r in records] == payloads
    data = path.read_bytes()
    whole = len(data)
    last = len(encode_record(*payloads[-1]))
    for cut in (1, last // 2, last - 1):  # killed mid-append: the torn record was never acknowledged
        path.write_bytes(data[:whole - cut])
        assert [(r.kind, r.peer, r.payload) for r in read_journal(path)[1]] == payloads[:-1]
    flipped = bytearray(data)
    flipped[-1] ^= 0xFF  # a corrupt last payload fails its CRC
    path.write_bytes(bytes(flipped))
    assert len(read_journal(path)[1]) == len(payloads) - 1
    path.write_bytes(b"")  # killed before the header
    assert read_journal(path) == (0, [])


def test_journalled_requests_are_answered_before_their_segment_and_the_file_goes_after_it(tmp_path: Path) -> None:
    store = init_store(tmp_path / "store")
    writer = SegmentWriter(store, kind="collect", durable=True)
    journal = Journal(store, writer.writer, durable=True)
    builder = new_builder()
    committer = Committer(writer, RecentKeys(1000), max_queue_spans=10_000,
                          prepare=lambda t: normalize(promote(t)), builder=builder,
                          assemble=base_from_columns if builder is not None else None,
                          journal=journal, journal_s=3600.0, segment_spans=1_000_000)
    committer.start()
    rng = random.Random(11)
    made = [pb_body(30, rng) for _ in range(3)]
    futures = []
    for body, _ in made[:2]:  # the columnar path (or the Python decoder without the C extension)
        queued = committer.submit_protobuf(body, "10.1.2.3", journal=True)
        if queued is None:
            table, _ = decode_protobuf_base(body)
            futures.append(committer.submit(with_peer(table, "10.1.2.3"), journal=True))
        else:
            futures.append(queued[1])
    table, _ = decode_protobuf_base(made[2][0])
    futures.append(committer.submit(table, journal=True))  # a decoded table: journalled as Arrow IPC
    for future in futures:
        assert future.result(timeout=60).segments == 0  # answered from the journal
    assert segment_files(store) == []  # no segment yet (journal_s is an hour)
    files = list(journal_dir(store).glob("*.journal"))
    assert len(files) == 1
    assert len(read_journal(files[0])[1]) == 3
    committer.close()
    assert sorted(_keys(store)) == sorted(k for _, keys in made for k in keys)
    assert list(journal_dir(store).glob("*.journal")) == []


def test_a_lone_client_is_answered_only_once_its_segment_is_written(tmp_path: Path) -> None:
    store = init_store(tmp_path / "store")
    writer = SegmentWriter(store, kind="collect", durable=True)
    committer = Committer(writer, RecentKeys(1000), max_queue_spans=10_000, prepare=lambda t: normalize(promote(t)),
                          journal=Journal(store, writer.writer, durable=True), journal_s=3600.0,
                          segment_spans=1_000_000)
    committer.start()
    body, keys = pb_body(10, random.Random(3))
    table, _ = decode_protobuf_base(body)
    assert committer.submit(table).result(timeout=60).segments == 1
    assert sorted(_keys(store)) == sorted(keys)
    assert list(journal_dir(store).glob("*.journal")) == []
    committer.close()


@pytest.mark.parametrize("written_before_kill", [0, 1, 2])
def test_replay_stores_every_journalled_span_once(tmp_path: Path, written_before_kill: int) -> None:
    """A dead receiver's journal of 3 protobuf bodies and 1 Arrow table; 0-2 of the bodies' spans already in
    a segment written after the generation began (killed between the segment and the file's deletion)."""
    store = init_store(tmp_path / "store")
    rng = random.Random(100 + written_before_kill)
    made = [pb_body(25, rng) for _ in range(4)]
    started_ns = time.time_ns()
    journal = Journal(store, _writer_name(_dead_pid()), durable=True)
    records = [encode_record(PROTOBUF, "10.9.9.9", body) for body, _ in made[:3]]
    arrow_table, _ = decode_protobuf_base(made[3][0])
    records.append(encode_record(ARROW, None, _ipc(arrow_table)))
    journal.append(0, started_ns, records)
    journal.close()
    dead = SegmentWriter(store, kind="collect", durable=True)
    for body, _ in made[:written_before_kill]:
        table, _ = decode_protobuf_base(body)
        dead.write(normalize(promote(with_peer(table, "10.9.9.9"))))
    writer = SegmentWriter(store, kind="collect", durable=True)
    keys = RecentKeys(0)  # dedupe turned off: the replay finds what is already stored by itself
    replayed = replay_journals(store, writer, keys, lambda t: normalize(promote(t)))
    assert (replayed.files, replayed.spans) == (1, 100)
    assert replayed.stored == 100 - 25 * written_before_kill
    stored = _keys(store)
    assert sorted(stored) == sorted(k for _, ks in made for k in ks)  # every span, none twice
    con = connect(store)
    peers = con.execute("SELECT count(*) FROM spans WHERE ResourceAttributes['tailscope.peer'] = '10.9.9.9'"
                        ).fetchone()
    con.close()
    assert peers == (75,)  # the protobuf records' peer is recorded as the live path records it
    assert list(journal_dir(store).glob("*.journal")) == []
    assert replay_journals(store, writer, keys, lambda t: normalize(promote(t))).files == 0


def test_a_live_receivers_journal_is_not_replayed(tmp_path: Path) -> None:
    import os

    store = init_store(tmp_path / "store")
    journal = Journal(store, _writer_name(os.getpid()), durable=True)
    body, _ = pb_body(5, random.Random(1))
    journal.append(0, time.time_ns(), [encode_record(PROTOBUF, None, body)])
    writer = SegmentWriter(store, kind="collect", durable=True)
    assert replay_journals(store, writer, RecentKeys(10), lambda t: normalize(promote(t))).files == 0
    assert segment_files(store) == []
    journal.close()


def test_replay_writes_one_file_at_a_time_and_a_headerless_file_widens_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two generations of a dead receiver and a file killed before its header: one segment per generation (the
    replay holds one group at a time), and the segments read for keys are those since the oldest header, not
    the whole store (a header-less file has no start)."""
    store = init_store(tmp_path / "store")
    rng = random.Random(5)
    made = [pb_body(20, rng) for _ in range(4)]
    journal = Journal(store, _writer_name(_dead_pid()), durable=True)
    started_ns = time.time_ns()
    journal.append(0, started_ns, [encode_record(PROTOBUF, None, body) for body, _ in made[:2]])
    journal.append(1, started_ns + 1000, [encode_record(PROTOBUF, None, body) for body, _ in made[2:]])
    journal.close()
    journal.path(2).write_bytes(b"")  # killed before the header: nothing in it was acknowledged
    ages: list[float] = []
    load = RecentKeys.load

    def spy(self: RecentKeys, store: Path, max_age_s: float) -> int:
        ages.append(max_age_s)
        return load(self, store, max_age_s)

    monkeypatch.setattr(RecentKeys, "load", spy)
    writer = SegmentWriter(store, kind="collect", durable=True)
    replayed = replay_journals(store, writer, RecentKeys(0), lambda t: normalize(promote(t)))
    assert (replayed.files, replayed.spans, replayed.stored) == (3, 80, 80)
    assert len(segment_files(store)) == 2
    assert sorted(_keys(store)) == sorted(k for _, ks in made for k in ks)
    assert len(ages) == 1 and ages[0] < 60.0
    assert list(journal_dir(store).glob("*.journal")) == []


def test_clients_that_start_together_are_journalled_from_their_first_body(tmp_path: Path) -> None:
    """A body read while another connection's whole body is still being decoded is answered from the journal:
    clients that start at the same moment do not each wait for a segment (the connection seen sending
    only once its body is queued came too late for the others' first bodies)."""
    import gzip
    import http.client
    import threading
    from concurrent.futures import Future

    from intake.collect.commit import CommitResult
    from intake.collect.decode import Decoded
    from tests.intake.collect_helpers import running

    rng = random.Random(5)
    (body_a, keys_a), (body_b, keys_b) = pb_body(40, rng), pb_body(40, rng)
    store = tmp_path / "store"
    with running(store, grpc_port=None) as receiver:
        calls: list[tuple[bytes, bool]] = []
        entered, release = threading.Event(), threading.Event()
        accept = receiver.intake.accept

        def held_accept(body: bytes, encoding: str, *, peer: str | None = None, journal: bool = False
                        ) -> tuple[Decoded, Future[CommitResult] | None]:
            calls.append((body, journal))
            if body == body_a:  # A's body stays in decoding until B has been answered
                entered.set()
                release.wait(60)
            return accept(body, encoding, peer=peer, journal=journal)

        receiver.intake.accept = held_accept  # type: ignore[method-assign]  # an accept held on one body

        def post(body: bytes, out: list[int]) -> None:
            con = http.client.HTTPConnection("127.0.0.1", receiver.http_port, timeout=60)
            # gzip: decoded on the worker threads, so A's held decoding blocks neither the loop nor B
            con.request("POST", "/v1/traces", gzip.compress(body), {"Content-Type": "application/x-protobuf",
                                                                    "Content-Encoding": "gzip"})
            out.append(con.getresponse().status)
            con.close()

        status_a: list[int] = []
        sender = threading.Thread(target=post, args=(body_a, status_a))
        sender.start()
        assert entered.wait(60)
        status_b: list[int] = []
        post(body_b, status_b)  # answered while A is still being decoded: from the journal
        release.set()
        sender.join(60)
        assert status_a == status_b == [200]
        assert calls == [(body_a, False), (body_b, True)]
        assert receiver.committer.journalled_requests == 1
    assert sorted(_keys(store)) == sorted(keys_a + keys_b)
