"""Newer vLLM: opt-in GenAI span names, vllm.request.* stage children, arrival_time_ns = 0, string process id."""

from __future__ import annotations

from pathlib import Path

from intake.engines.vllm import ATTR_UNMAPPED, UNPLACED_REASON
from tests.intake.engine_fixtures import (
    FIXTURES,
    MS,
    T0,
    assert_stages_sum_to_e2e,
    files,
    ingest_files,
    requests,
    sql,
    stage_ms,
)

FIXTURE = FIXTURES / "vllm_optin.otlp.jsonl"


def test_fixture_file_is_what_the_builder_makes() -> None:
    assert FIXTURE.read_text() == files()["vllm_optin.otlp.jsonl"]


def test_opt_in_names_and_stage_children(tmp_path: Path) -> None:
    store = tmp_path / "store"
    ingest_files(store, FIXTURE)
    rows = requests(store)
    assert [r["span_name"] for r in rows] == ["chat facebook/opt-125m"] * 2
    assert_stages_sum_to_e2e(rows)
    e, g = rows
    # E: the children measured queue (5-25 ms), prefill (25-60) and decode (60-300): they replace the
    # attribute layout; preprocess is the start up to the first child; streaming yields to decode
    assert stage_ms(e) == {"preprocess": 5.0, "queue_wait": 20.0, "prefill": 35.0, "decode": 240.0}
    assert (e["model"], e["ttft_ns"], e["e2e_ns"], e["replica"], e["service"]) == (
        "facebook/opt-125m", 60 * MS, 300 * MS, "5151", "vllm.llm_engine")  # vllm.process_id, a string
    # G: arrival_time_ns = 0 but e2e known: it starts at end - e2e
    assert (g["start_ns"], g["e2e_ns"], stage_ms(g)) == (T0 + 7800 * MS, 200 * MS, {"other": 200.0})


def test_a_request_without_arrival_time_or_e2e_is_kept_but_not_counted(tmp_path: Path) -> None:
    store = tmp_path / "store"
    ingest_files(store, FIXTURE)
    [f] = sql(store, f"SELECT IsRequest, TimestampNs, Duration, SpanAttributes['{ATTR_UNMAPPED}'] AS why "
                     "FROM spans WHERE SpanAttributes['gen_ai.request.id'] = 'cmpl-f'")
    assert f == {"IsRequest": False, "TimestampNs": T0 + 7000 * MS, "Duration": 0, "why": UNPLACED_REASON}
