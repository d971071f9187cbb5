"""SGLang 0.5.23 request traces (`--enable-trace`) through `tailscope ingest`.

Format: sglang-0.5.23 wheel, python/sglang/srt/observability/trace.py (`TraceReqContext`: root
span f"{role} Req {rid[:8]}" with attributes rid/module, one thread span per process thread with
host_id/pid/thread_label, slice spans below it, nested slices below an open slice, tracer
"sglang server") and req_time_stats.py (`RequestStage` slice names, root gen_ai.* attributes from
`convert_to_gen_ai_span_attrs`). The main branch names the dispatch slice `dispatch`, 0.5.23
`api_server_dispatch`; both map. Fixture: tests/intake/fixtures/engines/sglang.otlp.jsonl.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc

from intake.engines import normalize
from intake.otlp import decode_json
from tests.intake.engine_fixtures import (
    FIXTURES,
    assert_stages_sum_to_e2e,
    collect_requests,
    files,
    ingest_files,
    requests,
    sdk_resource,
    sql,
    stage_ms,
)
from tracing.rows import SpanBatch
from tracing.store import SegmentWriter, init_store

FIXTURE = FIXTURES / "sglang.otlp.jsonl"


def test_fixture_file_is_what_the_builder_makes() -> None:
    assert FIXTURE.read_text() == files()["sglang.otlp.jsonl"]


def test_slices_become_stages_that_sum_to_e2e(tmp_path: Path) -> None:
    store = tmp_path / "store"
    ingest_files(store, FIXTURE)
    row, _ = requests(store)
    assert_stages_sum_to_e2e([row])
    assert row["span_name"] == " Req 9f2c41ab" and row["e2e_ns"] == 310_000_000
    # preprocess = tokenize 5 + dispatch 1 + request_process 1; queue = prefill_waiting 12 + decode_waiting 2;
    # prefill_forward 20→60 (its chunked_prefill slices are inside it); decode_forward 62→300;
    # streaming = root end − last engine slice (detokenize, send); other = the 6→7 ms hand-off
    assert stage_ms(row) == {"preprocess": 7.0, "queue_wait": 14.0, "prefill": 40.0, "decode": 238.0,
                             "streaming": 10.0, "other": 1.0}


def test_shape_fields(tmp_path: Path) -> None:
    store = tmp_path / "store"
    ingest_files(store, FIXTURE)
    row, _ = requests(store)
    assert (row["model"], row["input_tokens"], row["output_tokens"], row["ttft_ns"], row["status"]) == (
        "Qwen/Qwen2.5-7B-Instruct", 128, 40, 61_000_000, "ok")
    # SGLang's resource holds only service.name: the replica is host_id[:8]:pid of the scheduler thread span
    assert (row["replica"], row["service"]) == ("abcd1234:2002", "sglang")
    native_stage_spans = sql(store, "SELECT count(*) AS n FROM spans WHERE Stage IS NOT NULL "
                                    "AND SpanAttributes['tailscope.synthetic'] IS NULL")
    assert native_stage_spans == [{"n": 0}]  # the native slices keep their own names; copies carry the stage


def test_disaggregated_prefill_and_decode_roots_are_one_request(tmp_path: Path) -> None:
    """Both nodes emit a root for the same rid under the router's span: the decode root is the request and the
    prefill node's slices are laid on it too (prefill_prepare/bootstrap/waiting/forward)."""
    store = tmp_path / "store"
    ingest_files(store, FIXTURE)
    _, row = requests(store)
    assert_stages_sum_to_e2e([row])
    assert row["span_name"] == "decode Req 77aa0c1e" and row["e2e_ns"] == 410_000_000
    # preprocess: tokenize 0→4 (both nodes, overlapping) + prepare 5→6; queue: bootstrap 6→20 and prefill_waiting
    # →25, decode_waiting 91→93; prefill 25→70 (prefill node); decode 93→400; streaming 400→410; other: 4→5 and
    # the KV transfer 70→91 (transfer slices are not mapped)
    assert stage_ms(row) == {"preprocess": 5.0, "queue_wait": 21.0, "prefill": 45.0, "decode": 307.0,
                             "streaming": 10.0, "other": 22.0}
    assert (row["replica"], row["ttft_ns"], row["input_tokens"], row["output_tokens"]) == (
        "dddd0000:3003", 95_000_000, 2048, 120)
    roots = sql(store, "SELECT SpanName, IsRequest FROM spans WHERE SpanName LIKE '%Req 77aa0c1e' ORDER BY 1")
    assert roots == [{"SpanName": "decode Req 77aa0c1e", "IsRequest": True},
                     {"SpanName": "prefill Req 77aa0c1e", "IsRequest": False}]


def test_root_alone_falls_back_to_its_latency_attributes(tmp_path: Path) -> None:
    """A collect batch may hold the root without its slices: its gen_ai.latency.* attributes are laid out."""
    batch = SpanBatch()
    for line in FIXTURE.read_text().splitlines():
        decode_json(line, batch)
    table = batch.to_table()
    root_only = table.filter(pc.equal(table.column("SpanName"), " Req 9f2c41ab"))
    assert root_only.num_rows == 1
    store = tmp_path / "store"
    init_store(store)
    SegmentWriter(store, kind="test").write(normalize(root_only))
    [row] = requests(store)
    assert_stages_sum_to_e2e([row])
    # TTFT 61 ms; time_in_model_prefill (55 ms, from dispatch end, so it includes the scheduler queue) ends
    # there; preprocess is the 6 ms before it; decode 249 ms fills the rest
    assert stage_ms(row) == {"preprocess": 6.0, "prefill": 55.0, "decode": 249.0}
    # no thread span in the table: the replica falls back to the process's random SDK UUID
    assert row["ttft_ns"] == 61_000_000
    assert row["replica"] == sdk_resource({"service.name": "sglang"}, 3)["service.instance.id"]


def test_collect_stores_what_ingest_stores(tmp_path: Path) -> None:
    """`tailscope collect` (OTLP/gRPC, SGLang's default exporter) stores the same requests as ingest."""
    ingest_files(tmp_path / "ingested", FIXTURE)
    assert collect_requests(tmp_path / "collected", "sglang.otlp.jsonl", "grpc") == requests(tmp_path / "ingested")
