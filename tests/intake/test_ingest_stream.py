"""Large OTLP/JSON documents are decoded span by span (intake.otlp_stream) with bounded memory,
and store exactly what the whole-document parse stores."""

from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import intake.ingest as ingest_mod
from benchmarks.bench_ingest_memory import big_document
from intake.ingest import ingest_files
from intake.otlp import decode_json
from intake.otlp_stream import decode_json_stream
from tracing.errors import InputError
from tracing.rows import SpanBatch

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_traces" / "data"


# --- random documents ------------------------------------------------------------------------


class Obj(list):
    """A JSON object as (key, value) pairs, so a key may repeat."""


def dump(value: Any, rng: random.Random) -> str:
    """JSON text of `value` with random whitespace between tokens and random ASCII escaping."""
    def ws() -> str:
        return rng.choice(["", "", "", " ", "\n", "\t ", "\r\n  "])
    if isinstance(value, Obj | dict):
        pairs = list(value) if isinstance(value, Obj) else list(value.items())
        inner = ",".join(f"{ws()}{json.dumps(k)}{ws()}:{ws()}{dump(v, rng)}{ws()}" for k, v in pairs)
        return "{" + inner + ws() + "}"
    if isinstance(value, list):
        return "[" + ",".join(ws() + dump(v, rng) + ws() for v in value) + ws() + "]"
    return json.dumps(value, ensure_ascii=rng.random() < 0.5)


def rand_attr_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(8 if depth < 2 else 5)
    if kind == 0:
        return {"stringValue": rng.choice(["a", "é", "x" * rng.randint(0, 30), "\u2603 snow", "tab\tq\"uote"])}
    if kind == 1:
        return {"intValue": rng.choice([str(rng.randint(-10**12, 10**12)), rng.randint(-99, 99), "12x"])}
    if kind == 2:
        return {"doubleValue": rng.choice([rng.random(), 1e300, "2.5", "nope"])}
    if kind == 3:
        return {"boolValue": rng.random() < 0.5}
    if kind == 4:
        return {"bytesValue": rng.choice(["aGk=", "not base64!"])}
    if kind == 5:
        return {"arrayValue": {"values": [rand_attr_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]}}
    if kind == 6:
        return {"kvlistValue": {"values": [{"key": f"k{i}", "value": rand_attr_value(rng, depth + 1)}
                                           for i in range(rng.randint(0, 3))]}}
    return rng.choice([{}, "plain", None])


def rand_attrs(rng: random.Random) -> Any:
    if rng.random() < 0.05:
        return rng.choice([None, "oops", [{"value": {}}]])
    return [{"key": rng.choice(["service.name", "host.name", "a", "b", "gen_ai.request.model", "tailscope.stage"]),
             "value": rand_attr_value(rng)} for _ in range(rng.randint(0, 4))]


def rand_span(rng: random.Random) -> Any:
    start = rng.choice([1_700_000_000_000_000_000, 10**19, -5, 0])
    span: dict[str, Any] = {
        "traceId": rng.choice([rng.randbytes(16).hex()] * 8 + ["", "zz", "00" * 16, rng.randbytes(16).hex().upper()]),
        "spanId": rng.choice([rng.randbytes(8).hex()] * 8 + ["abc", 5]),
        "name": rng.choice(["prefill", "decode", "chat m", 7, "é"]),
        "startTimeUnixNano": rng.choice([str(start), start]),
        "endTimeUnixNano": str(start + rng.choice([1000, -10, 0])),
        "kind": rng.choice([1, 2, "SPAN_KIND_SERVER", "weird", None]),
        "attributes": rand_attrs(rng),
    }
    if rng.random() < 0.5:
        span["parentSpanId"] = rng.choice(["", rng.randbytes(8).hex()])
    if rng.random() < 0.3:
        span["status"] = rng.choice([{"code": 2, "message": "boom"}, {"code": "STATUS_CODE_OK"}, None, "bad"])
    if rng.random() < 0.3:
        span["events"] = [{"timeUnixNano": str(start + 5), "name": "e", "attributes": rand_attrs(rng)}]
    if rng.random() < 0.2:
        span["links"] = [{"traceId": rng.randbytes(16).hex(), "spanId": rng.randbytes(8).hex(),
                          "attributes": rand_attrs(rng)}]
    if rng.random() < 0.1:
        span["droppedAttributesCount"] = 0
    if rng.random() < 0.03:
        return rng.choice(["a span", 3, None])
    return Obj(rng.sample(list(span.items()), len(span)))


def rand_document(rng: random.Random) -> tuple[Any, bool]:
    """A random ExportTraceServiceRequest and whether the streaming walk must answer it by itself
    (no repeated key, no two spellings of one list, no resource or scope that is not an object)."""
    plain = True
    rss = []
    for _ in range(rng.randint(0, 3)):
        scopes = []
        for _ in range(rng.randint(0, 3)):
            pairs: list[tuple[str, Any]] = []
            if rng.random() < 0.8:
                pairs.append(("scope", rng.choice([{"name": "lib", "version": "1"}, {}, None, {"name": 5}])))
            if rng.random() < 0.15:
                pairs.append(("instrumentationLibrary", {"name": "old", "version": "0.1"}))
            if rng.random() < 0.9:
                pairs.append(("spans", rng.choice([[rand_span(rng) for _ in range(rng.randint(0, 5))]] * 5 + [None])))
            if rng.random() < 0.2:
                pairs.append(("schemaUrl", "https://example.invalid/s"))
            rng.shuffle(pairs)
            if rng.random() < 0.03 and pairs:
                pairs.append(pairs[0])
                plain = False
            scopes.append(Obj(pairs) if rng.random() > 0.03 else rng.choice([3, "x"]))
            plain &= not isinstance(scopes[-1], int | str)
        pairs = []
        if rng.random() < 0.85:
            resource: object = rng.choice([{"attributes": rand_attrs(rng)}, {}, None, {"attributes": rand_attrs(rng)}])
            if rng.random() < 0.03:
                resource = ["not", "an", "object"]
                plain = False
            pairs.append(("resource", resource))
        spelling = "scopeSpans" if rng.random() < 0.85 else "instrumentationLibrarySpans"
        pairs.append((spelling, scopes if rng.random() < 0.95 else None))
        if rng.random() < 0.05:
            pairs.append(("instrumentationLibrarySpans" if spelling == "scopeSpans" else "scopeSpans", []))
            plain = False
        rng.shuffle(pairs)
        rss.append(Obj(pairs))
    top: list[tuple[str, Any]] = [("resourceSpans", rss)]
    if rng.random() < 0.2:
        top.append(("partialSuccess", {"rejectedSpans": "0"}))
    rng.shuffle(top)
    return Obj(top), plain


def mutate(text: str, rng: random.Random) -> str:
    """Break `text` one way: cut it, change one character, or add something after it."""
    how = rng.randrange(3)
    if how == 0:
        return text[:rng.randrange(len(text))]
    if how == 1:
        i = rng.randrange(len(text))
        return text[:i] + rng.choice([",", "]", "}", "{", ":", '"', "x", "\\"]) + text[i + 1:]
    return text + rng.choice(["{}", "x", " \n ", ","])


def whole(data: bytes, strict: bool) -> tuple[Any, ...]:
    batch = SpanBatch()
    try:
        r = decode_json(data, batch, strict=strict)
    except Exception as exc:  # whatever the whole parse raises, the walk must raise it too or step aside
        return ("error", type(exc).__name__, str(exc))
    return ("ok", batch.to_table(), r.accepted, r.rejected, r.errors)


def streamed(data: bytes, strict: bool, chunk: int) -> tuple[Any, ...] | None:
    tables: list[pa.Table] = []
    try:
        r = decode_json_stream(data, strict=strict, chunk_spans=chunk, on_chunk=lambda b: tables.append(b.to_table()))
    except ValueError as exc:
        return ("error", type(exc).__name__, str(exc))
    if r is None:
        return None
    table = pa.concat_tables(tables) if tables else SpanBatch().to_table()
    return ("ok", table, r.accepted, r.rejected, r.errors)


def same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == "error":
        return a == b
    return bool(a[1].equals(b[1])) and a[2:] == b[2:]


def test_streaming_decode_equals_the_whole_parse_on_random_documents() -> None:
    rng = random.Random(1313)
    answered = stepped_aside = broken_answered = 0
    for n in range(1500):
        doc, plain = rand_document(rng)
        text = dump(doc, rng)
        broken = rng.random() < 0.25
        if broken:
            text = mutate(text, rng)
        data = text.encode()
        for strict in (False, True):
            expected = whole(data, strict)
            got = streamed(data, strict, chunk=rng.randint(1, 4))
            if got is None:
                # the walk may step aside (the caller then parses whole), but never on a plain document
                assert broken or not plain, (n, strict, text[:300], expected[:1])
                stepped_aside += 1
                continue
            assert same(expected, got), (n, strict, text[:300], expected[0], got[0], expected[2:], got[2:])
            answered += 1
            broken_answered += broken
    # the comparison covered both kinds: documents the walk answered itself, broken ones included
    assert answered > 1500 and stepped_aside > 100 and broken_answered > 20, (answered, stepped_aside,
                                                                              broken_answered)


def test_resource_and_scope_after_their_spans_are_applied_to_them() -> None:
    span = {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "x", "startTimeUnixNano": "5",
            "endTimeUnixNano": "9"}
    text = json.dumps({"resourceSpans": [{
        "scopeSpans": [{"spans": [span], "scope": {"name": "late-scope", "version": "2"}}],
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "late-svc"}}]}}]})
    got = streamed(text.encode(), True, chunk=1)
    assert got is not None and same(whole(text.encode(), True), got)
    row = got[1].to_pylist()[0]
    assert (row["ServiceName"], row["ScopeName"], row["ScopeVersion"]) == ("late-svc", "late-scope", "2")


# --- through `ingest` -----------------------------------------------------------------------


def _stored(store: Path) -> pa.Table:
    files = sorted((store / "spans").rglob("*.parquet"))
    table = pa.concat_tables([pq.read_table(f) for f in files])
    return table.sort_by([("TraceId", "ascending"), ("SpanId", "ascending")])


@pytest.mark.parametrize("sample", ["basic.otlp.jsonl.gz", "incidents/cold_start.otlp.jsonl.gz"])
def test_ingest_stores_the_same_spans_streamed_and_whole(tmp_path: Path, sample: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    path = SAMPLES / sample
    reports = []
    for threshold, name in ((0, "streamed"), (1 << 62, "whole")):
        monkeypatch.setattr(ingest_mod, "STREAM_JSON_BYTES", threshold)
        monkeypatch.setattr(ingest_mod, "STREAM_CHUNK_SPANS", 97)
        reports.append(ingest_files([path], tmp_path / name))
    a, b = _stored(tmp_path / "streamed"), _stored(tmp_path / "whole")
    assert a.num_rows == reports[0].spans_written > 1000
    assert a.equals(b)
    assert (reports[0].spans_read, reports[0].rejected_spans) == (reports[1].spans_read, reports[1].rejected_spans)


def test_a_bad_large_line_is_reported_as_the_whole_parse_reports_it(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    lines = gzip.decompress((SAMPLES / "basic.otlp.jsonl.gz").read_bytes()).splitlines()[:6]
    lines[3] = lines[3][:-40]  # cut: invalid JSON on line 4
    lines[1] = lines[1].replace(b'"startTimeUnixNano":"', b'"startTimeUnixNano":"-', 1)  # a rejected span
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    outcomes = []
    for threshold in (0, 1 << 62):
        monkeypatch.setattr(ingest_mod, "STREAM_JSON_BYTES", threshold)
        with pytest.raises(InputError) as info:
            ingest_files([path], tmp_path / f"strict-{threshold}")
        report = ingest_files([path], tmp_path / f"skip-{threshold}", skip_bad=True)
        outcomes.append((str(info.value), report.spans_written, report.bad_lines, report.rejected_spans,
                         report.problems, _stored(tmp_path / f"skip-{threshold}")))
    assert outcomes[0][:5] == outcomes[1][:5]
    assert "line 2" in outcomes[0][0] or ":2" in outcomes[0][0]
    assert outcomes[0][2] == 1 and outcomes[0][3] == 1
    assert outcomes[0][5].equals(outcomes[1][5])


CHILD = """
import sys
from pathlib import Path
import intake.ingest as I
def hwm():
    for line in Path('/proc/self/status').read_text().splitlines():
        if line.startswith('VmHWM:'):
            return int(line.split()[1]) * 1024
if sys.argv[4] == 'whole':
    I.STREAM_JSON_BYTES = 1 << 62
I.ingest_files([Path(sys.argv[1])], Path(sys.argv[3]) / 'warm')  # imports and first-use costs
base = hwm()
report = I.ingest_files([Path(sys.argv[2])], Path(sys.argv[3]) / 'big')
print(base, hwm(), report.spans_written)
"""


def _growth(small: Path, big: Path, work: Path, mode: str) -> tuple[int, int]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(small), str(big), str(work / mode), mode], cwd=ROOT,
                         check=True, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT))).stdout.split()
    return int(out[1]) - int(out[0]), int(out[2])


#: Peak memory an ingest of one large JSON line may add, as a multiple of the line's size: the file's
#: bytes and their text (1x each for ASCII), the Arrow tables (under 1x) and one batch of spans.
#: The whole-document parse needs about 13x.
GROWTH_BOUND = 4.0


@pytest.mark.slow
def test_ingest_of_one_large_json_line_stays_within_a_bound_of_its_size(tmp_path: Path) -> None:
    small, big = tmp_path / "small.json", tmp_path / "big.json"
    small.write_bytes(big_document(200_000, seed=4) + b"\n")
    big.write_bytes(big_document(24 << 20, seed=5) + b"\n")
    size = big.stat().st_size
    growth, spans = _growth(small, big, tmp_path, "streamed")
    assert spans > 40_000
    assert growth <= GROWTH_BOUND * size, f"peak grew {growth / size:.1f}x the input"
    # the bound separates the two decoders: the whole-document parse exceeds it on the same line
    whole_growth, whole_spans = _growth(small, big, tmp_path, "whole")
    assert whole_spans == spans and whole_growth > GROWTH_BOUND * size, whole_growth / size
