"""/metrics: the span histograms against a plain per-span count, bounded labels, exemplars, the served endpoint.

`SpanMetrics` counts whole columns at once (pyarrow group-by); a plain loop over the spans
(bisect into BUCKETS_S, one dict per label set) must give the same buckets, sums and counts on
random tables, and every exemplar must lie in its bucket and belong to a span of that label set.
The endpoint is checked as Prometheus reads it: OpenMetrics text parsed by prometheus_client's parser.
"""

from __future__ import annotations

import bisect
import random
import urllib.error
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from intake.collect.metrics import BUCKETS_S, OTHER, SpanMetrics, store_bytes
from tailscope.commands.metrics import StoreTail, serve_metrics
from tracing import schema as S

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def _table(rng: random.Random, n: int) -> pa.Table:
    """n random promoted spans: a third are request spans, the rest stage spans (or neither)."""
    rows: dict[str, list[Any]] = defaultdict(list)
    for _ in range(n):
        kind = rng.random()
        is_request = kind < 0.35
        rows["IsRequest"].append(is_request if rng.random() > 0.05 else None)
        rows["Stage"].append(None if is_request or kind > 0.9 else rng.choice(S.ALL_STAGES))
        rows["Outcome"].append(rng.choice([*S.OUTCOMES, None]) if is_request else None)
        rows["ServiceName"].append(rng.choice(["chat", "embed"]))
        rows["Model"].append(rng.choice(["m1", "m2", None]))
        rows["ModelVersion"].append(rng.choice(["v1", "v2"]))
        rows["Replica"].append(f"r-{rng.randrange(6)}")
        rows["Tenant"].append(f"t-{rng.randrange(5)}")
        rows["Duration"].append(int(10 ** rng.uniform(5, 11.5)))
        rows["TraceId"].append(f"{rng.getrandbits(128):032x}")
        ttft = int(rows["Duration"][-1] * rng.random()) if is_request and rng.random() < 0.7 else None
        rows["TtftNs"].append(ttft)
        rows["OutputTokens"].append(rng.choice([None, 0, 1, 2, 17, 400]) if is_request else None)
    types = {"IsRequest": pa.bool_(), "Duration": pa.int64(), "TtftNs": pa.int64(), "OutputTokens": pa.int64()}
    return pa.table({k: pa.array(v, types.get(k, pa.string())) for k, v in rows.items()})


def _reference(tables: list[pa.Table], tenants: int) -> dict[str, dict[tuple[str, ...], tuple[list[int], float]]]:
    """Per histogram and label set: (per-bucket counts, sum in s), counting span by span."""
    out: dict[str, dict[tuple[str, ...], tuple[list[int], float]]] = defaultdict(dict)
    kept: dict[str, list[str]] = defaultdict(list)
    limits = {"replica": 3, "tenant": tenants}

    def bound(name: str, value: str | None) -> str:
        if value is None:
            return ""
        if name not in limits:
            return value
        if value not in kept[name] and len(kept[name]) < limits[name]:
            kept[name].append(value)
        return value if value in kept[name] else OTHER

    def add(hist: str, key: tuple[str, ...], ns: int) -> None:
        counts, total = out[hist].get(key, ([0] * (len(BUCKETS_S) + 1), 0.0))
        counts[bisect.bisect_left([round(b * 1e9) for b in BUCKETS_S], ns)] += 1
        out[hist][key] = (counts, total + ns / 1e9)

    for table in tables:
        # labels are bounded in the order their values first appear among request and stage spans
        for r in table.to_pylist():
            if r["IsRequest"]:
                key = (r["ServiceName"], r["Model"] or "", r["ModelVersion"], bound("replica", r["Replica"]),
                       r["Outcome"] or "ok") + ((bound("tenant", r["Tenant"]),) if tenants else ())
                add("request", key, r["Duration"])
                if r["TtftNs"] is not None:
                    add("ttft", key, r["TtftNs"])
                    if (r["OutputTokens"] or 0) > 1:
                        add("tpot", key, round((r["Duration"] - r["TtftNs"]) / (r["OutputTokens"] - 1)))
            elif r["Stage"] is not None:
                key = (r["ServiceName"], r["Stage"], r["Model"] or "", r["ModelVersion"],
                       bound("replica", r["Replica"]))
                add("stage", key, r["Duration"])
    return out


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_histograms_match_a_plain_count(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import intake.collect.metrics as M
    monkeypatch.setitem(M.LABEL_LIMITS, "replica", 3)  # small bound, so folding into `other` is exercised
    rng = random.Random(seed)
    tenants = seed % 3  # 0: no tenant label
    tables = [_table(rng, rng.randrange(1, 400)) for _ in range(4)]
    metrics = SpanMetrics(tenants)
    for t in tables:
        metrics.observe(t)
    want = _reference(tables, tenants)
    for name in ("request", "ttft", "tpot", "stage"):
        hist = getattr(metrics, name)
        got = {k: (s.counts.tolist(), s.sum_s) for k, s in hist.series.items()}
        assert set(got) == set(want[name]), name
        for key, (counts, total) in want[name].items():
            assert got[key][0] == counts, (name, key)
            assert got[key][1] == pytest.approx(total, rel=1e-9)
            for b, (trace, value, _) in hist.series[key].exemplars.items():  # in its bucket, a real trace
                lo = BUCKETS_S[b - 1] if b else 0.0
                hi = BUCKETS_S[b] if b < len(BUCKETS_S) else float("inf")
                assert lo < value <= hi or (b == 0 and value <= hi)
                assert any(r["TraceId"] == trace for t in tables for r in t.to_pylist())
    replicas = {k[3] for k in metrics.request.series}
    assert OTHER in replicas and len(replicas - {OTHER}) == 3


def test_a_table_without_promoted_columns_is_ignored() -> None:
    metrics = SpanMetrics()
    metrics.observe(pa.table({"x": [1, 2]}))
    assert metrics.series_count() == 0


def test_the_endpoint_serves_openmetrics_with_exemplars_and_checks_the_token(tmp_path: Path) -> None:
    metrics = SpanMetrics()
    metrics.observe(_table(random.Random(7), 300))
    server = serve_metrics([], "127.0.0.1", 0, token="s3cret", renderers=[metrics.render])
    try:
        url = f"http://127.0.0.1:{server.port}/metrics"
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(urllib.request.Request(url, headers={"Accept": OPENMETRICS}), timeout=10)
        assert err.value.code == 401
        req = urllib.request.Request(url, headers={"Accept": OPENMETRICS, "Authorization": "Bearer s3cret"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
            text = resp.read().decode()
    finally:
        server.stop()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    fam = families["tailscope_request_duration_seconds"]
    assert fam.type == "histogram"
    counts = {k: s.counts.sum() for k, s in metrics.request.series.items()}
    names = ("service", "model", "model_version", "replica", "outcome")
    exemplars = 0
    for sample in fam.samples:
        key = tuple(sample.labels[n] for n in names)
        if sample.name.endswith("_count"):
            assert sample.value == counts[key]
        if sample.name.endswith("_bucket") and sample.exemplar is not None:
            exemplars += 1
            assert len(sample.exemplar.labels["trace_id"]) == 32
    assert exemplars >= len(counts)  # at least one per label set


@pytest.mark.parametrize("openmetrics", [True, False])
def test_the_fast_rendering_parses_as_prometheus_clients_own(openmetrics: bool) -> None:
    """SpanMetrics.render writes the text itself (for speed): parsed, it must equal the library's rendering."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import generate_latest as text_latest
    from prometheus_client.openmetrics.exposition import generate_latest as om_latest
    from prometheus_client.parser import text_string_to_metric_families as text_parse

    metrics = SpanMetrics(tenants=2)
    rng = random.Random(11)
    for _ in range(3):
        table = _table(rng, 200)
        metrics.observe(table.set_column(table.schema.get_field_index("Replica"), "Replica",
                                         pa.array(['r "1"\\x\n'] * table.num_rows)))  # escaped label values
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    parse = text_string_to_metric_families if openmetrics else text_parse
    ours = metrics.render(openmetrics).decode() + ("# EOF\n" if openmetrics else "")
    theirs = (om_latest if openmetrics else text_latest)(registry).decode()

    def samples(text: str) -> list[Any]:
        return sorted((s.name, sorted(s.labels.items()), s.value,
                       (s.exemplar.labels, s.exemplar.value, s.exemplar.timestamp) if s.exemplar else None)
                      for f in parse(text) for s in f.samples)
    assert samples(ours) == samples(theirs) and len(samples(ours)) > 100


def test_the_store_tail_counts_each_new_segment_once(tmp_path: Path) -> None:
    import duckdb
    from typer.testing import CliRunner

    from tailscope.cli import app
    from tracing.store import init_store
    store = init_store(tmp_path / "store")
    metrics = SpanMetrics()
    tail = StoreTail(store, metrics, from_start=False)
    assert tail.poll() == 0
    sample = Path(S.__file__).parents[1] / "sample_traces" / "data" / "basic.otlp.jsonl.gz"
    result = CliRunner().invoke(app, ["ingest", "--quiet", "--store", str(store), str(sample)])
    assert result.exit_code == 0, result.output
    spans, requests = duckdb.execute(f"SELECT count(*), count(*) FILTER (WHERE IsRequest) FROM "
                                     f"read_parquet('{store}/spans/*/*/*.parquet')").fetchall()[0]
    assert tail.poll() == spans and tail.poll() == 0  # each segment once
    assert sum(int(s.counts.sum()) for s in metrics.request.series.values()) == requests > 0
    assert store_bytes(store) > 0


def test_the_receivers_health_is_what_it_did(tmp_path: Path) -> None:
    """Counters of a real receiver after known posts: 8 spans stored, 8 sent again (duplicates), one bad body,
    one commit-latency sample per accepted request; a hook is absent while it returns None."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.openmetrics.exposition import generate_latest

    from intake.collect.metrics import ReceiverMetrics
    from tests.intake.collect_helpers import pb_body, running

    body, _ = pb_body(8, random.Random(5))
    with running(tmp_path / "store", metrics_port=0, journal_ms=0) as receiver:
        url = f"http://127.0.0.1:{receiver.http_port}/v1/traces"
        for data in (body, body):
            req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/x-protobuf"})
            urllib.request.urlopen(req, timeout=30).read()
        bad = urllib.request.Request(url, data=b"\xff\xff not protobuf",
                                     headers={"Content-Type": "application/x-protobuf"})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(bad, timeout=30)
        assert err.value.code == 400
        lag: list[float | None] = [None]
        health = ReceiverMetrics(receiver)
        health.hook("tailscope_store_compaction_lag_seconds", "Compaction lag.", lambda: lag[0])
        registry = CollectorRegistry(auto_describe=False)
        registry.register(health)
        first = generate_latest(registry).decode()
        lag[0] = 12.5
        second = generate_latest(registry).decode()
    values = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for f in text_string_to_metric_families(second) for s in f.samples}
    assert values[("tailscope_receiver_spans_received_total", ())] == 16
    assert values[("tailscope_receiver_spans_stored_total", ())] == 8
    assert values[("tailscope_receiver_spans_duplicate_total", ())] == 8
    assert values[("tailscope_receiver_refused_total", (("reason", "bad_request"),))] == 1
    assert values[("tailscope_receiver_refused_total", (("reason", "overload"),))] == 0
    assert values[("tailscope_receiver_commit_latency_seconds_count", ())] == 2
    assert values[("tailscope_receiver_store_bytes", ())] > 0  # the segment (measured once per 10 s)
    assert "compaction_lag" not in first and values[("tailscope_store_compaction_lag_seconds", ())] == 12.5
