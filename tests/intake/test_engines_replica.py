"""Replica identity as each engine and the OpenTelemetry SDK build their resources (docs/convention.md#replica)."""

from __future__ import annotations

import os
import random
import uuid
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind

from analysis.engine.connect import connect
from intake.peer import peer_host, with_peer
from tests.intake.collect_helpers import T0, running
from tracing.rows import SpanBatch, attr_str, is_random_instance_id, replica_of

DEFAULT_ORDER = ("tailscope.replica", "k8s.pod.name", "host.name", "service.instance.id", "tailscope.peer",
                 "process.pid", "vllm.process_id")


def _resource(attrs: dict[str, str], *, create: bool) -> dict[str, str]:
    """A resource's attributes as stored: Resource.create (SDK defaults, a random UUID) or Resource(...)."""
    res = Resource.create(attrs) if create else Resource(attrs)
    return {k: attr_str(v) for k, v in res.attributes.items()}


def test_vllm_resource_as_init_otel_tracer_builds_it() -> None:
    # vllm-project/vllm vllm/tracing/otel.py init_otel_tracer @40eeb0c: Resource.create with these three keys
    vllm = {"service.name": "vllm.llm_engine", "vllm.instrumenting_module_name": "vllm.llm_engine",
            "vllm.process_id": "4242"}
    attrs = _resource(vllm, create=True)
    assert is_random_instance_id(attrs["service.instance.id"])  # the SDK's per-process UUID
    assert replica_of(attrs) == "4242"  # vllm.process_id, never the UUID
    assert replica_of({**attrs, "k8s.pod.name": "vllm-7f9c-0"}) == "vllm-7f9c-0"
    assert replica_of({**attrs, "tailscope.peer": "10.0.0.7"}) == "10.0.0.7"
    assert replica_of({**attrs, "tailscope.replica": "gpu-node-3", "host.name": "h"}) == "gpu-node-3"


def test_sdk_uuid_is_the_last_resort_and_two_processes_of_one_pod_share_the_peer() -> None:
    # SGLang: the tokenizer and the scheduler process each call Resource.create (two random UUIDs)
    a = _resource({"service.name": "sglang"}, create=True)
    b = dict(a, **{"service.instance.id": str(uuid.uuid4())})
    assert replica_of(a) == a["service.instance.id"]  # nothing else: the UUID rather than nothing
    assert replica_of({**a, "tailscope.peer": "10.0.0.9"}) == replica_of({**b, "tailscope.peer": "10.0.0.9"})
    # a name a person chose in service.instance.id is kept (tailscope.configure writes <host>-<pid>)
    assert replica_of({"service.instance.id": "node-1-77", "process.pid": "77"}) == "node-1-77"


@pytest.mark.parametrize("service", ["text-generation-inference.router", "triton-inference-server"])
def test_tgi_and_triton_resources_hold_only_service_name(service: str) -> None:
    # TGI router/src/logging.rs and Triton src/tracer.cc build a resource of service.name alone
    attrs = _resource({"service.name": service}, create=False)
    assert replica_of(attrs) is None
    assert replica_of({**attrs, "tailscope.peer": "10.1.2.3"}) == "10.1.2.3"


def _reference(resource: dict[str, str], keys: tuple[str, ...]) -> str | None:
    """Independent reading of the rule: rank every present key; a UUID instance id ranks after all."""
    ranked = []
    for rank, key in enumerate(keys):
        value = resource.get(key, "")
        if not value:
            continue
        random_id = key == "service.instance.id" and len(value) == 36 and value.count("-") == 4 \
            and value[14] in "12345678" and value[19].lower() in "89ab"
        ranked.append((rank + (100 if random_id else 0), value))
    return min(ranked)[1] if ranked else None


def test_replica_rule_matches_a_reference_on_random_resources(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(14)
    pool = [*DEFAULT_ORDER, "service.name", "cloud.region"]
    for trial in range(2000):
        keys: tuple[str, ...] = DEFAULT_ORDER
        if trial % 4 == 3:
            keys = tuple(rng.sample(pool, rng.randint(1, 4)))
            monkeypatch.setenv("TAILSCOPE_REPLICA_KEYS", " , ".join(keys))
        else:
            monkeypatch.delenv("TAILSCOPE_REPLICA_KEYS", raising=False)
        resource = {}
        for key in rng.sample(pool, rng.randint(0, len(pool))):
            resource[key] = rng.choice([str(uuid.uuid4()), f"{key}-v", "", "1", str(uuid.uuid1())])
        assert replica_of(resource) == _reference(resource, keys), (resource, keys)


def test_peer_host_forms() -> None:
    assert peer_host(("10.0.0.7", 51234)) == "10.0.0.7"
    assert peer_host(("::1", 4318, 0, 0)) == "::1"
    assert peer_host("ipv4:127.0.0.1:40000") == "127.0.0.1"
    assert peer_host("ipv6:[::1]:40000") == "::1"
    assert peer_host("unix:/tmp/s") is None
    assert peer_host(None) is None


def test_with_peer_keeps_a_declared_peer_and_recomputes_the_replica() -> None:
    batch = SpanBatch()
    for i, res in enumerate(({"service.name": "tgi"}, {"service.name": "x", "host.name": "h1"},
                             {"service.name": "y", "tailscope.peer": "10.9.9.9"})):
        batch.append(trace_id="a" * 32, span_id=f"{i + 1:016x}", parent_span_id="", name="s", kind="Server",
                     start_ns=T0, end_ns=T0 + 1, service=res["service.name"], resource=res, attrs={})
    table = with_peer(batch.to_table(), "10.0.0.1")
    assert table.column("Replica").to_pylist() == ["10.0.0.1", "h1", "10.9.9.9"]
    assert [dict(r)["tailscope.peer"] for r in table.column("ResourceAttributes").to_pylist()] == [
        "10.0.0.1", "10.0.0.1", "10.9.9.9"]


def _send_tgi_like(port: int, service: str) -> None:
    provider = TracerProvider(resource=Resource({"service.name": service}))  # no SDK defaults, as TGI's Rust SDK
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces")))
    span = provider.get_tracer("text_generation_router::server").start_span("generate", kind=SpanKind.SERVER,
                                                                             start_time=T0)
    span.end(end_time=T0 + 1_000_000)
    provider.shutdown()


@pytest.mark.parametrize("record_peer", [True, False])
def test_collect_names_a_bare_resource_by_the_sending_peer(tmp_path: Path, record_peer: bool) -> None:
    store = tmp_path / "store"
    with running(store, grpc_port=None, record_peer=record_peer) as receiver:
        assert receiver.http_port is not None
        _send_tgi_like(receiver.http_port, "text-generation-inference.router")
    con = connect(store)
    try:
        rows = con.execute("SELECT Replica, ResourceAttributes['tailscope.peer'] FROM spans").fetchall()
    finally:
        con.close()
    assert rows == ([("127.0.0.1", "127.0.0.1")] if record_peer else [(None, None)])
    assert os.environ.get("TAILSCOPE_REPLICA_KEYS") is None
