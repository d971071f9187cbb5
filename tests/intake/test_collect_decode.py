"""The receiver's fast decode path stores exactly what the pure-Python decoder stores.

`otlp.decode_protobuf_table` (C extraction + vectorized promotion, when the extension is
built) must equal `decode_protobuf` into a `SpanBatch`, row for row and byte for byte, on
requests full of awkward values: every AnyValue type, arrays, kvlists, duplicate keys,
unicode, NaN and infinities, odd enums, events, links, rejected spans, promotion inputs.
"""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from google.protobuf.internal.containers import RepeatedCompositeFieldContainer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue, KeyValueList

from intake import otlp
from intake.collect.decode import gunzip_capped
from intake.peer import with_peer
from tests.needs import need_c
from tracing import schema as S
from tracing.rows import SpanBatch

T0 = 1_763_647_200_000_000_000
DECODER = "the C decoder intake._otlpx"
STRINGS = ["", "a", "héllo ✓", 'q"uote\\', "tab\tnew\nline\x01\x7f", "ü", "Timeout_Error", "CANCELLED",
           "deadline exceeded", "TRUE", "true", "False", "12", "-7", "1e3", " 5", "abc", "007", "１２",
           "99999999999999999999", "12.9", "inf"]
KEYS = ["k", "x", S.ATTR_STAGE, S.ATTR_REQUEST, S.ATTR_OUTCOME, S.ATTR_ERROR_TYPE, S.ATTR_OPERATION,
        S.ATTR_TTFT_NS, *S.MODEL_KEYS, *S.TENANT_KEYS, *S.INPUT_TOKEN_KEYS, *S.OUTPUT_TOKEN_KEYS,
        *S.MODEL_VERSION_KEYS]


def any_value(rng: random.Random, depth: int = 0) -> AnyValue:
    v = AnyValue()
    kind = rng.randrange(9 if depth < 2 else 6)
    if kind == 8 and rng.random() < 0.7:
        kind = 6  # kvlists always take the Python path; keep most requests on the fast one
    if kind == 0:
        v.string_value = rng.choice(STRINGS + list(S.ALL_STAGES) + list(S.OUTCOMES))
    elif kind == 1:
        v.bool_value = rng.random() < 0.5
    elif kind == 2:
        v.int_value = rng.choice([0, 1, -1, 2**63 - 1, -(2**63), rng.randint(-10**6, 10**6)])
    elif kind == 3:
        v.double_value = rng.choice([0.0, -0.0, 0.1, 1.5, 1e300, -2.5e-308, float("inf"), float("-inf"),
                                     float("nan"), rng.random()])
    elif kind == 4:
        v.bytes_value = rng.randbytes(rng.randrange(5))
    elif kind == 5:
        pass  # an empty AnyValue
    elif kind in (6, 7):
        for _ in range(rng.randrange(4)):
            element = any_value(rng, depth + 1)
            if rng.random() < 0.8 and element.WhichOneof("value") in ("array_value", "kvlist_value", None):
                element = AnyValue(int_value=3)  # mostly flat arrays, which the fast path renders
            v.array_value.values.append(element)
        if kind == 7 and not v.array_value.values:
            v.array_value.SetInParent()
    else:
        for _ in range(rng.randrange(3)):
            v.kvlist_value.values.append(KeyValue(key=rng.choice(KEYS), value=any_value(rng, depth + 1)))
    return v


def add_attrs(target: RepeatedCompositeFieldContainer[KeyValue], rng: random.Random, n: int, awkward: bool) -> None:
    keys = rng.sample(KEYS, min(n, len(KEYS)))  # mostly unique keys, so the fast path runs
    if rng.random() < 0.05 and keys:
        keys.append(keys[0])  # a duplicate key: dict semantics, last value in first position
    for i in range(n):
        kv = target.add()
        kv.key = keys[i % len(keys)] if awkward else f"key{rng.randrange(1000)}"
        if awkward or rng.random() < 0.7:
            kv.value.CopyFrom(any_value(rng) if awkward else AnyValue(string_value=rng.choice(STRINGS)))
        else:
            kv.value.CopyFrom(AnyValue(double_value=rng.random()))


def request(rng: random.Random, awkward: bool) -> bytes:
    req = ExportTraceServiceRequest()
    for _r in range(rng.randrange(1, 3)):
        rs = req.resource_spans.add()
        add_attrs(rs.resource.attributes, rng, rng.randrange(4), awkward)
        if rng.random() < 0.7:
            kv = rs.resource.attributes.add()
            kv.key, kv.value.string_value = rng.choice(["service.name", *S.REPLICA_RESOURCE_KEYS]), "svc-1"
        for _s in range(rng.randrange(1, 3)):
            ss = rs.scope_spans.add()
            ss.scope.name, ss.scope.version = rng.choice(["", "lib"]), rng.choice(["", "1.0"])
            for _ in range(rng.randrange(0, 6)):
                sp = ss.spans.add()
                sp.trace_id = rng.randbytes(16) if rng.random() > 0.01 else b"\x00" * 16
                sp.span_id = rng.randbytes(8) if rng.random() > 0.01 else rng.randbytes(3)
                sp.parent_span_id = rng.choice([b"", rng.randbytes(8)])
                sp.name = rng.choice(["chat", "x", "héllo", *S.ALL_STAGES])
                sp.kind = rng.choice([0, 1, 2, 3, 4, 5, 6, -1])
                sp.trace_state = rng.choice(["", "a=b"])
                sp.start_time_unix_nano = T0 + rng.randrange(10**12)
                sp.end_time_unix_nano = sp.start_time_unix_nano + rng.randrange(-10 if rng.random() < 0.01 else 0,
                                                                                 10**9)
                sp.status.code = rng.choice([0, 1, 2, 2, 7])
                sp.status.message = rng.choice(["", "boom"])
                add_attrs(sp.attributes, rng, rng.randrange(8), awkward)
                for _e in range(rng.randrange(3)):
                    ev = sp.events.add()
                    ev.time_unix_nano, ev.name = T0 + rng.randrange(10**9), rng.choice(["", "tok"])
                    add_attrs(ev.attributes, rng, rng.randrange(3), awkward)
                for _l in range(rng.randrange(2)):
                    ln = sp.links.add()
                    ln.trace_id, ln.span_id, ln.trace_state = rng.randbytes(16), rng.randbytes(8), "s=1"
                    add_attrs(ln.attributes, rng, rng.randrange(3), awkward)
    return req.SerializeToString()


def slow_table(data: bytes) -> tuple[pa.Table, int, int]:
    batch = SpanBatch()
    result = otlp.decode_protobuf(data, batch)
    return batch.to_table(), result.accepted, result.rejected


@pytest.mark.parametrize("awkward", [False, True])
def test_fast_decode_equals_python_decode(awkward: bool) -> None:
    need_c(otlp.FAST_PROTOBUF, DECODER)  # without it this would compare the Python decoder with itself
    rng = random.Random(42 + awkward)
    for _ in range(400):
        data = request(rng, awkward)
        fast, result = otlp.decode_protobuf_table(data)
        slow, accepted, rejected = slow_table(data)
        assert (result.accepted, result.rejected) == (accepted, rejected)
        assert fast.schema == S.SPAN_SCHEMA
        assert fast.to_pylist() == slow.to_pylist() or _nan_equal(fast, slow)


def _nan_equal(a: pa.Table, b: pa.Table) -> bool:
    return str(a.to_pylist()) == str(b.to_pylist())  # NaN != NaN, but both render 'nan'


def test_promotion_of_a_group_equals_per_request_promotion() -> None:
    rng = random.Random(9)
    datas = [request(rng, True) for _ in range(60)]
    group = otlp.promote(pa.concat_tables([otlp.decode_protobuf_base(d)[0] for d in datas]))
    one_by_one = pa.concat_tables([slow_table(d)[0] for d in datas])
    assert str(group.to_pylist()) == str(one_by_one.to_pylist())


def test_fast_path_is_built() -> None:
    """The benchmark figures assume the C extension; `pip install` builds it when a C compiler is there."""
    need_c(otlp.FAST_PROTOBUF, DECODER)
    assert otlp._otlpx is not None


def test_gzip_cap_cuts_a_bomb_off() -> None:
    import gzip

    bomb = gzip.compress(b"\x00" * (32 << 20))
    with pytest.raises(ValueError, match="limit after gzip decompression"):
        gunzip_capped(bomb, 1 << 20)
    assert gunzip_capped(gzip.compress(b"abc") + gzip.compress(b"def"), 6) == b"abcdef"
    with pytest.raises(ValueError, match="limit"):
        gunzip_capped(gzip.compress(b"abc") + gzip.compress(b"def"), 5)


@pytest.mark.parametrize("where", ["name", "key", "value", "scope"])
def test_invalid_utf8_is_malformed_on_both_paths(where: str) -> None:
    req = ExportTraceServiceRequest()
    ss = req.resource_spans.add().scope_spans.add()
    ss.scope.name = "SCOPE"
    sp = ss.spans.add()
    sp.trace_id, sp.span_id, sp.name = b"\x01" * 16, b"\x02" * 8, "NAME"
    sp.attributes.add(key="KEY", value=AnyValue(string_value="VALUE"))
    bad = b"\xed\xa0\x80x"[: len(where)].ljust(len(where), b"x")  # an encoded surrogate: not UTF-8
    data = req.SerializeToString().replace(where.upper().encode(), bad)
    with pytest.raises(ValueError, match=r"malformed OTLP protobuf.*UTF-8"):
        otlp.decode_protobuf_base(data)
    with pytest.raises(ValueError, match="UTF-8"):
        otlp.decode_protobuf(data, SpanBatch())


def test_builder_rolls_back_what_it_cannot_take() -> None:
    need_c(otlp.FAST_PROTOBUF, DECODER)
    rng = random.Random(12)
    goods = [request(rng, False) for _ in range(40)]
    goods = [g for g in goods if otlp._otlpx.extract(g) is not None][:3]
    builder = otlp.new_builder()
    odd = ExportTraceServiceRequest.FromString(goods[0])
    odd.resource_spans[0].resource.attributes.add(key="kv", value=AnyValue(kvlist_value=KeyValueList()))
    n0 = builder.add(goods[0])
    assert builder.add(odd.SerializeToString()) is None  # needs the Python decoder: nothing added
    assert builder.add(goods[0][: len(goods[0]) // 2]) is None  # truncated: nothing added
    n_big = len(otlp.decode_protobuf_base(goods[1])[0])
    if n_big:
        assert builder.add(goods[1], n_big - 1) == -1  # over the room left: nothing added
    assert builder.add(goods[2], 10**9) == len(otlp.decode_protobuf_base(goods[2])[0])
    assert builder.spans == n0 + len(otlp.decode_protobuf_base(goods[2])[0])
    got = otlp.base_from_columns(builder.take())
    want = pa.concat_tables([otlp.decode_protobuf_base(goods[0])[0], otlp.decode_protobuf_base(goods[2])[0]])
    assert str(got.to_pylist()) == str(want.to_pylist())
    assert builder.spans == 0
    # the builder reuses its buffers after take(): a second group comes out whole and alone
    assert builder.add(goods[1]) == n_big
    again = otlp.base_from_columns(builder.take())
    assert str(again.to_pylist()) == str(otlp.decode_protobuf_base(goods[1])[0].to_pylist())


@pytest.mark.parametrize("awkward", [False, True])
def test_builder_records_the_peer_as_with_peer_does(awkward: bool) -> None:
    """`collect --record-peer` keeps the fast path: the C builder adds tailscope.peer to each resource
    lacking it, exactly as intake.peer.with_peer does after the Python decoder (Replica included)."""
    need_c(otlp.FAST_PROTOBUF, DECODER)
    rng = random.Random(77 + awkward)
    taken = 0
    for i in range(300):
        req = ExportTraceServiceRequest.FromString(request(rng, awkward))
        for rs in req.resource_spans:  # some senders state a peer of their own: it is kept
            if rng.random() < 0.2:
                rs.resource.attributes.add(key=S.ATTR_PEER, value=AnyValue(string_value=rng.choice(["", "10.1.1.1"])))
        data = req.SerializeToString()
        peer = rng.choice(["127.0.0.5", "::1", "10.0.0.7", "héllo"])
        builder = otlp.new_builder()
        n = builder.add(data, -1, peer)
        slow = with_peer(slow_table(data)[0], peer)
        if n is None:  # a body the builder does not take goes through the Python decoder anyway
            continue
        taken += 1
        assert n == slow.num_rows
        fast = otlp.promote(otlp.base_from_columns(builder.take())) if n else slow.slice(0, 0)
        assert str(fast.to_pylist()) == str(slow.to_pylist()), i
    assert taken >= 50  # the comparison is not vacuous: the builder took a good share of the bodies


def test_builder_groups_equal_the_python_decoder_with_doubles_everywhere() -> None:
    """Builder.add writes the text of double values after its GIL-free parse (moving what follows them and
    the value offsets): many bodies with doubles in every attribute list (arrays of them too), bodies it
    refuses or rolls back in between, and several takes must give exactly the Python decoder's spans."""
    need_c(otlp.FAST_PROTOBUF, DECODER)
    rng = random.Random(2026)

    def doubles(target: RepeatedCompositeFieldContainer[KeyValue]) -> None:
        for i in range(rng.randrange(4)):
            kv = target.add(key=f"d{i}")
            if rng.random() < 0.3:
                for _ in range(rng.randrange(4)):
                    kv.value.array_value.values.append(AnyValue(double_value=rng.choice(
                        [rng.random(), 1e22, -0.0, 5e-324, float("nan"), float("inf"), 1.0])))
                kv.value.array_value.SetInParent()
            else:
                kv.value.double_value = rng.choice([rng.random() * 10 ** rng.randint(-30, 30), 0.5, -3.0,
                                                    float("nan"), float("-inf"), 2.0 ** rng.randint(-1074, 1023)])

    builder = otlp.new_builder()
    want: list[pa.Table] = []
    groups = 0
    for i in range(240):
        req = ExportTraceServiceRequest.FromString(request(rng, False))
        for rs in req.resource_spans:
            doubles(rs.resource.attributes)
            for ss in rs.scope_spans:
                for sp in ss.spans:
                    doubles(sp.attributes)
                    for ev in sp.events:
                        doubles(ev.attributes)
                    for ln in sp.links:
                        doubles(ln.attributes)
        data = req.SerializeToString()
        slow = slow_table(data)[0]
        n = builder.add(data, rng.choice([-1, -1, max(0, slow.num_rows - 1)]), "127.0.0.1")
        if n is not None and n >= 0:
            want.append(with_peer(slow, "127.0.0.1"))
        if i % 40 == 39:  # a group: everything taken since the last one, in order
            got = otlp.promote(otlp.base_from_columns(builder.take()))
            assert str(got.to_pylist()) == str(pa.concat_tables(want).to_pylist()), i
            groups += 1 if want else 0
            want = []
    assert groups == 6
