"""The receiver under hostile input: each case is sent, exactly, to a running `tailscope collect`
(HTTP and gRPC, with the C decoder and without it), and a good request afterwards must be stored.

Cases: times beyond int64, negative times, deeply nested JSON, empty requests,
bodies from unauthenticated or over-budget senders, slow or silent connections, the bearer
scheme's case. Memory probes read the child's RSS from /proc.
"""

from __future__ import annotations

import itertools
import json
import random
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from analysis.engine.connect import connect
from intake import otlp
from intake.collect.config import CollectConfig, exposure_warning
from intake.otlp import MAX_JSON_DEPTH, json_depth
from tests.intake.collect_child import Child, raw_exchange, request_with_times, start_child
from tests.intake.collect_helpers import T0, pb_body
from tests.needs import need_c

TOKEN = "hostile-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PB = {"Content-Type": "application/x-protobuf", **AUTH}
JS = {"Content-Type": "application/json", **AUTH}
BIG = 10_413_792_000_000_000_000  # 2300-01-01, beyond int64 nanoseconds
_SEEDS = itertools.count(1000)  # every body gets fresh span ids: a re-sent id would be dropped as a duplicate
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


@pytest.fixture(scope="module", params=["c", "python"])
def child(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Child]:
    if request.param == "c":
        need_c(otlp.FAST_PROTOBUF, "the C decoder intake._otlpx")
    root = tmp_path_factory.mktemp(f"hostile-{request.param}")
    token_file = root / "token"
    token_file.write_text(TOKEN + "\n")
    c = start_child(root / "store", "--token-file", str(token_file), "--max-body-mib", "8",
                    "--max-inflight-mib", "20", "--header-timeout-s", "1", "--read-timeout-s", "1",
                    "--body-timeout-s", "3", "--idle-timeout-s", "2", decoder=request.param)
    yield c
    log = c.stop()
    assert "Traceback" not in log, log


def stored(store: Path) -> int:
    con = connect(store)
    try:
        row = con.execute("SELECT count(*) FROM spans").fetchone()
        assert row is not None
        return int(row[0])
    finally:
        con.close()


def good_request_is_stored(c: Child, _case: int) -> None:
    """After the hostile input: a good protobuf body is answered 200 and its spans are stored."""
    before = stored(c.store)
    body, _ = pb_body(5, random.Random(next(_SEEDS)))
    r = httpx.post(c.url, content=body, headers=PB, timeout=60)
    assert r.status_code == 200, r.text
    assert stored(c.store) == before + 5


def json_request(starts: list[Any], ends: list[Any], seed: int) -> bytes:
    rng = random.Random(seed)
    spans = [{"traceId": rng.randbytes(16).hex(), "spanId": rng.randbytes(8).hex(), "name": f"s{i}",
              "startTimeUnixNano": s, "endTimeUnixNano": e} for i, (s, e) in enumerate(zip(starts, ends, strict=True))]
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}).encode()


def grpc_export(c: Child, body: bytes, token: str = TOKEN) -> bytes:
    with grpc.insecure_channel(f"127.0.0.1:{c.grpc_port}") as channel:
        answer: bytes = channel.unary_unary(EXPORT)(body, timeout=60, metadata=[("authorization", f"Bearer {token}")])
        return answer


# --- 1, 2: times out of the int64 range ----------------------------------------------------------


@pytest.mark.parametrize("transport", ["http-protobuf", "http-json", "grpc"])
def test_time_beyond_int64_rejects_that_span_and_stores_the_others(child: Child, transport: str) -> None:
    starts, ends = [T0, BIG, T0 + 10], [T0 + 5, BIG + 5, T0 + 20]
    before = stored(child.store)
    if transport == "http-json":
        r = httpx.post(child.url, content=json_request([str(s) for s in starts], [str(e) for e in ends], next(_SEEDS)),
                       headers=JS, timeout=60)
        assert r.status_code == 200, r.text
        partial = r.json()["partialSuccess"]
        rejected, message = int(partial["rejectedSpans"]), partial["errorMessage"]
    else:
        body = request_with_times(starts, ends, seed=next(_SEEDS)).SerializeToString()
        if transport == "grpc":
            answer = ExportTraceServiceResponse.FromString(grpc_export(child, body))
        else:
            r = httpx.post(child.url, content=body, headers=PB, timeout=60)
            assert r.status_code == 200, r.text
            answer = ExportTraceServiceResponse.FromString(r.content)
        rejected, message = answer.partial_success.rejected_spans, answer.partial_success.error_message
    assert rejected == 1
    assert f"startTimeUnixNano {BIG} is outside 0..{otlp.MAX_TIME_NS}" in message
    assert stored(child.store) == before + 2
    good_request_is_stored(child, 3)


@pytest.mark.parametrize("start", [-1_000_000_000, "-1000000000"])
def test_negative_json_time_is_rejected(child: Child, start: Any) -> None:
    before = stored(child.store)
    r = httpx.post(child.url, content=json_request([start, str(T0)], [str(T0), str(T0 + 1)], next(_SEEDS)),
                   headers=JS, timeout=60)
    assert r.status_code == 200, r.text
    partial = r.json()["partialSuccess"]
    assert partial["rejectedSpans"] == "1"
    assert "startTimeUnixNano -1000000000 is outside" in partial["errorMessage"]
    assert stored(child.store) == before + 1
    con = connect(child.store)
    assert con.execute("SELECT count(*) FROM spans WHERE TimestampNs < 0").fetchone() == (0,)
    con.close()
    good_request_is_stored(child, 5)


# --- 3: nesting -----------------------------------------------------------------------------


def test_deeply_nested_json_is_400_naming_the_limit(child: Child) -> None:
    body = b"[" * 900 + b"]" * 900  # 1.8 KB; the 25 KB variant nests the same way
    r = httpx.post(child.url, content=body, headers=JS, timeout=60)
    assert r.status_code == 400
    assert r.json()["message"] == f"JSON nested 900 levels deep; the limit is {MAX_JSON_DEPTH}"
    # nested attribute values in an otherwise valid request: 9 levels down to the attribute value,
    # 3 per arrayValue level, 1 for the innermost value
    value = '{"arrayValue": {"values": [' * 300 + '{"stringValue": "x"}' + "]}}" * 300
    nested = json_request([str(T0)], [str(T0 + 1)], next(_SEEDS)).decode().replace(
        '"name": "s0"', f'"name": "s0", "attributes": [{{"key": "k", "value": {value}}}]')
    r = httpx.post(child.url, content=nested.encode(), headers=JS, timeout=60)
    assert r.status_code == 400
    assert r.json()["message"] == f"JSON nested {9 + 3 * 300 + 1} levels deep; the limit is {MAX_JSON_DEPTH}"
    good_request_is_stored(child, 7)


def test_json_depth_matches_a_reference_walk() -> None:
    """The vectorized depth scan against a character-by-character walk on random JSON with
    brackets, quotes and backslashes inside strings."""
    def reference(text: str) -> int:
        depth = deepest = 0
        in_string = escaped = False
        for ch in text:
            if in_string:
                if escaped:
                    escaped = False
                elif ch == "\\":
                    escaped = True
                elif ch == '"':
                    in_string = False
            elif ch == '"':
                in_string = True
            elif ch in "[{":
                depth += 1
                deepest = max(deepest, depth)
            elif ch in "]}":
                depth -= 1
        return deepest

    rng = random.Random(8)

    def value(level: int) -> Any:
        r = rng.random()
        if level > 9 or r < 0.3:
            return rng.choice(['a"[\\', 'x\\"]{', "\\\\", "{", 'q"}', 1, 2.5, None, True])
        if r < 0.6:
            return [value(level + 1) for _ in range(rng.randint(0, 3))]
        return {rng.choice(["k", '"[', "\\{"]): value(level + 1) for _ in range(rng.randint(0, 3))}

    for _ in range(2000):
        text = json.dumps(value(0))
        assert json_depth(text.encode()) == reference(text), text


# --- 4: empty requests ----------------------------------------------------------------------------


def test_empty_request_is_200(child: Child) -> None:
    before = stored(child.store)
    r = httpx.post(child.url, content=b"", headers=PB, timeout=60)
    assert r.status_code == 200, r.text
    assert not ExportTraceServiceResponse.FromString(r.content).HasField("partial_success")
    r = httpx.post(child.url, content=b"{}", headers=JS, timeout=60)
    assert (r.status_code, r.content) == (200, b"{}")
    assert not ExportTraceServiceResponse.FromString(grpc_export(child, b"")).HasField("partial_success")
    # an empty request in the same group as a good one (several at once)
    body, _ = pb_body(3, random.Random(next(_SEEDS)))
    with httpx.Client(timeout=60) as client:
        for payload in (b"", body, b""):
            assert client.post(child.url, content=payload, headers=PB).status_code == 200
    assert stored(child.store) == before + 3
    good_request_is_stored(child, 10)


# --- 5: bodies before auth and limits ------------------------------------------------------------


def _head(length: int, headers: dict[str, str]) -> bytes:
    lines = ["POST /v1/traces HTTP/1.1", "Host: x", f"Content-Length: {length}",
             *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def _send_and_answer(port: int, head: bytes, body_bytes: int) -> int:
    """Send `head` and up to `body_bytes` of body (stopping when an answer comes); the status."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(head)
        sock.setblocking(False)
        sent = 0
        chunk = b"\0" * 65536
        answer = b""
        while sent < body_bytes:
            try:
                answer += sock.recv(65536)
                if answer:
                    break
            except BlockingIOError:
                pass
            try:
                sent += sock.send(chunk)
            except BlockingIOError:
                time.sleep(0.001)
            except OSError:
                break
        sock.setblocking(True)
        while b"\r\n\r\n" not in answer:
            more = sock.recv(65536)
            if not more:
                break
            answer += more
        return _status(answer)


def test_unauthenticated_and_oversized_bodies_are_refused_before_they_are_read(child: Child) -> None:
    """8 senders declare 120 MiB each without a token (the issue's probe): each gets 401 after a
    small part of its body, and the receiver's memory does not grow by the bodies."""
    rss_before = child.rss_mib()
    declared = 120 << 20
    statuses = []
    for _ in range(8):
        statuses.append(_send_and_answer(child.http_port, _head(declared, {"Content-Type": "application/x-protobuf"}),
                                         16 << 20))
    assert statuses == [401] * 8
    # with the token but over the body cap: 413 from the Content-Length alone
    assert _send_and_answer(child.http_port, _head(declared, PB), 16 << 20) == 413
    assert child.rss_mib() - rss_before < 48, (rss_before, child.rss_mib())
    good_request_is_stored(child, 11)


def test_unauthenticated_grpc_messages_are_refused_before_they_are_read(child: Child) -> None:
    """8 gRPC clients without the token send two 7.5 MiB messages each at once: every call is
    UNAUTHENTICATED, and the receiver's peak memory does not grow by the messages (grpcio reads a
    unary message whole before its handler runs; the gate answers from the metadata without asking
    for it). Read whole, the 16 messages would add at least 8 x 7.5 MiB at once."""
    def senders(body: bytes) -> list[grpc.StatusCode]:
        codes: list[grpc.StatusCode] = []

        def client() -> None:
            with grpc.insecure_channel(f"127.0.0.1:{child.grpc_port}") as channel:
                call = channel.unary_unary(EXPORT)
                for _ in range(2):
                    with pytest.raises(grpc.RpcError) as err:
                        call(body, timeout=120, metadata=[("authorization", "Bearer not-the-token")])
                    codes.append(err.value.code())

        threads = [threading.Thread(target=client) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return codes

    # the same calls with 1 KiB messages first: server threads and connection buffers come into use
    assert senders(b"x" * 1024) == [grpc.StatusCode.UNAUTHENTICATED] * 16
    child.reset_peak()
    rss_before = child.rss_mib()
    assert senders(random.Random(7).randbytes(int(7.5 * (1 << 20)))) == [grpc.StatusCode.UNAUTHENTICATED] * 16
    assert child.peak_mib() - rss_before < 16, (rss_before, child.peak_mib())
    # with the token the same channel works
    assert ExportTraceServiceResponse.FromString(grpc_export(child, pb_body(3, random.Random(next(_SEEDS)))[0]))
    good_request_is_stored(child, 13)


def test_the_byte_budget_is_claimed_before_the_body(child: Child) -> None:
    """Two stalled 8 MiB bodies hold 16 of the 20 MiB budget: a third is 503 at once; the stalled
    ones are dropped with 408 after --read-timeout-s and the budget is free again."""
    rss_before = child.rss_mib()
    socks = []
    for _ in range(2):
        s = socket.create_connection(("127.0.0.1", child.http_port), timeout=60)
        s.sendall(_head(8 << 20, PB) + b"\0" * 1000)
        socks.append(s)
    for _ in range(50):  # until the receiver has read both heads (a loaded machine may take a while)
        answer = raw_exchange(child.http_port, _head(8 << 20, PB))
        if _status(answer) == 503:
            break
        time.sleep(0.1)
    assert b"retry-after: 1" in answer.lower() and b"too many request bytes in flight (16,777,216)" in answer
    for s in socks:
        answer = s.recv(65536)
        assert _status(answer) == 408 and b"no body bytes for 1 s" in answer
        s.close()
    assert child.rss_mib() - rss_before < 48
    good_request_is_stored(child, 12)


# --- 6: timeouts ------------------------------------------------------------------------------


def test_silent_connections_are_closed(child: Child) -> None:
    # a partial header, then silence: 408 after --header-timeout-s and the connection closes
    with socket.create_connection(("127.0.0.1", child.http_port), timeout=60) as sock:
        sock.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        assert _status(answer) == 408 and b"request header not complete within 1 s" in answer
        assert time.monotonic() - started >= 0.9
    # a slow-loris sender dribbling header bytes is cut at the same deadline
    with socket.create_connection(("127.0.0.1", child.http_port), timeout=60) as sock:
        sock.sendall(b"POST /v1/traces HTTP/1.1\r\n")
        answer = b""
        for _ in range(100):
            try:
                sock.sendall(b"X-Slow: 1\r\n")
            except OSError:
                break
            time.sleep(0.1)
            sock.setblocking(False)
            try:
                answer += sock.recv(65536)
            except BlockingIOError:
                pass
            finally:
                sock.setblocking(True)
            if answer:
                break
        assert _status(answer) == 408
    # an idle connection (nothing sent) is closed after --idle-timeout-s without an answer
    with socket.create_connection(("127.0.0.1", child.http_port), timeout=60) as sock:
        assert sock.recv(65536) == b""
    good_request_is_stored(child, 13)


# --- 8: smaller items ----------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "Bearer"])
def test_bearer_scheme_in_any_case(child: Child, scheme: str) -> None:
    body, _ = pb_body(2, random.Random(next(_SEEDS)))
    before = stored(child.store)
    r = httpx.post(child.url, content=body, timeout=60,
                   headers={"Content-Type": "application/x-protobuf", "Authorization": f"{scheme} {TOKEN}"})
    assert r.status_code == 200
    r = httpx.post(child.url, content=body, timeout=60,
                   headers={"Content-Type": "application/x-protobuf", "Authorization": f"{scheme} wrong"})
    assert r.status_code == 401
    assert stored(child.store) == before + 2


def test_exposed_without_a_token_warns(tmp_path: Path) -> None:
    for host in ("0.0.0.0", "::", "192.0.2.7"):
        warning = exposure_warning(CollectConfig(store=tmp_path, host=host))
        assert warning is not None and f"listening on {host} without --token-file" in warning
        assert "/metrics" not in warning
        assert "read /metrics" in (exposure_warning(CollectConfig(store=tmp_path, host=host, metrics_port=0)) or "")
        assert exposure_warning(CollectConfig(store=tmp_path, host=host, token="t")) is None
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert exposure_warning(CollectConfig(store=tmp_path, host=host)) is None


def test_the_cli_warns_when_exposed_without_a_token(tmp_path: Path) -> None:
    """The warning comes before anything binds (here the store is a file, so the run stops there)."""
    import subprocess
    import sys

    from tests.intake.collect_helpers import ROOT

    not_a_store = tmp_path / "file"
    not_a_store.write_text("x")
    out = subprocess.run([sys.executable, "-m", "tailscope.cli", "collect", "--store", str(not_a_store),
                          "--host", "0.0.0.0", "--quiet"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "warning: listening on 0.0.0.0 without --token-file" in out.stderr


def test_restart_removes_temp_files_of_dead_writers_only(tmp_path: Path) -> None:
    """kill -9 mid-write leaves `.<segment>.<hex>.tmp`; the next start removes those of dead
    processes on this host and leaves a live writer's (and another host's) alone."""
    import os
    import socket
    import subprocess
    import sys

    from tests.intake.collect_helpers import running
    from tracing.store import init_store

    store = init_store(tmp_path / "store")
    directory = store / "spans" / "dt=2025-11-20" / "hr=14"
    directory.mkdir(parents=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead_pid = int(dead.stdout)
    host = socket.gethostname().replace("-", "").replace(".", "")[:16] or "host"
    files = {
        "dead": directory / f".collect-{host}-{dead_pid}-1a2b3c4d-000007.parquet.abc123.tmp",
        "live": directory / f".ingest-{host}-{os.getpid()}-1a2b3c4d-000001.parquet.def456.tmp",
        "other host": directory / f".collect-otherhost-{dead_pid}-1a2b3c4d-000001.parquet.0a0b0c.tmp",
    }
    for path in files.values():
        path.write_bytes(b"")
    with running(store) as receiver:
        assert receiver.removed_temp_files == [files["dead"]]
    assert not files["dead"].exists() and files["live"].exists() and files["other host"].exists()


def test_a_directory_ingest_that_stops_names_the_files_already_stored(tmp_path: Path) -> None:
    from intake.ingest import ingest_files
    from tracing.errors import InputError

    src = tmp_path / "in"
    src.mkdir()
    for name, seed in (("a.jsonl", 1), ("b.jsonl", 2)):
        (src / name).write_bytes(json_request([str(T0)], [str(T0 + 1)], seed) + b"\n")
    (src / "c.jsonl").write_bytes(b'{"resourceSpans": "abc}\n')
    with pytest.raises(InputError) as err:
        ingest_files([src], tmp_path / "store")
    assert str(err.value) == (
        f"{src / 'c.jsonl'}:1: invalid JSON (Unterminated string starting at, column 19); stopped here, after "
        f"storing 2 earlier file(s) ({src / 'a.jsonl'}, {src / 'b.jsonl'}); fix or move this file and run "
        "again (spans already stored are skipped)")
    assert stored(tmp_path / "store") == 2


#: The gRPC gate and timeouts do not depend on the decoder: their tests run once, with the C one (CI time).
C_DECODER_ONLY = pytest.mark.parametrize("child", ["c"], indirect=True)


@C_DECODER_ONLY
def test_an_unauthenticated_grpc_flood_does_not_starve_good_calls(child: Child) -> None:
    """Rounds of 120 unauthenticated calls launched at once (64 KiB messages: more than grpcio's
    32-call limit and the refusal queue) with 4 good calls launched among them: every good call is
    OK and stored; every flood call is refused (UNAUTHENTICATED, or UNIMPLEMENTED from grpcio
    itself when the refusal queue is full) and none reaches the store. Refused calls used to count
    toward grpcio's concurrent-call limit and wait in the workers' queue, so calls, good ones
    included, were refused RESOURCE_EXHAUSTED while a flood was being answered."""
    before = stored(child.store)
    flood = b"\x0a" * (64 << 10)
    refused: dict[grpc.StatusCode, int] = {}
    good_codes: dict[grpc.StatusCode, int] = {}

    def code_of(call: Any) -> grpc.StatusCode:
        exc = call.exception(timeout=60)
        return grpc.StatusCode.OK if exc is None else exc.code()

    with grpc.insecure_channel(f"127.0.0.1:{child.grpc_port}") as bad_channel, \
            grpc.insecure_channel(f"127.0.0.1:{child.grpc_port}") as good_channel:
        bad, good = bad_channel.unary_unary(EXPORT), good_channel.unary_unary(EXPORT)
        for _round in range(3):
            bad_calls, good_calls = [], []
            for i in range(120):
                bad_calls.append(bad.future(flood, timeout=60, metadata=[("authorization", "Bearer not-the-token")]))
                if i % 30 == 29:
                    body, _ = pb_body(5, random.Random(next(_SEEDS)))
                    good_calls.append(good.future(body, timeout=60, metadata=[("authorization", f"Bearer {TOKEN}")]))
            for call in good_calls:
                good_codes[code_of(call)] = good_codes.get(code_of(call), 0) + 1
            for call in bad_calls:
                refused[code_of(call)] = refused.get(code_of(call), 0) + 1
    assert good_codes == {grpc.StatusCode.OK: 12}, good_codes
    assert set(refused) <= {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNIMPLEMENTED}, refused
    assert sum(refused.values()) == 360 and refused.get(grpc.StatusCode.UNAUTHENTICATED, 0) > 0, refused
    assert stored(child.store) == before + 12 * 5
    good_request_is_stored(child, 14)


@C_DECODER_ONLY
def test_a_grpc_message_that_never_arrives_is_cut(child: Child) -> None:
    """An authenticated call that sends its headers and never its message holds a worker only until
    its connection is recycled (--body-timeout-s, then as long again for its calls): the call ends
    with an error while the client is still holding its message back, and good calls go on."""
    release = threading.Event()

    def never() -> Iterator[bytes]:
        release.wait(120)  # bound: the server should end the call long before this
        yield b""

    try:
        with grpc.insecure_channel(f"127.0.0.1:{child.grpc_port}") as channel:
            stalled = channel.stream_unary(EXPORT).future(never(), timeout=150,
                                                           metadata=[("authorization", f"Bearer {TOKEN}")])
            good_request_is_stored(child, 15)  # HTTP meanwhile
            assert ExportTraceServiceResponse.FromString(grpc_export(child, pb_body(2, random.Random(next(_SEEDS)))[0]))
            error = stalled.exception(timeout=150)
            assert not release.is_set()  # ended by the server, not by the client
            assert error is not None and error.code() == grpc.StatusCode.UNAVAILABLE, error
    finally:
        release.set()
    good_request_is_stored(child, 16)
