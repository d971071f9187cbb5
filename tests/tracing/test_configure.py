"""configure(): argument > environment variable > default, exporters, and a host that never crashes."""

from __future__ import annotations

import importlib
import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

import tracing
import tracing.store
from analysis.engine.connect import connect
from tests.tracing.otel_helpers import reset_globals
from tracing import schema as S

C = importlib.import_module("tracing.configure")  # the module (tracing.configure is the function)


@pytest.fixture(autouse=True)
def _fresh_globals(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in (*C.ENV_VARS, "OTEL_SERVICE_NAME"):
        monkeypatch.delenv(name, raising=False)
    reset_globals()
    yield
    reset_globals()


def test_argument_beats_env_beats_default(tmp_path: Path) -> None:
    env = {C.ENV_SERVICE_NAME: "env-svc", C.ENV_REPLICA_ID: "env-rep", C.ENV_STORE: str(tmp_path / "env"),
           C.ENV_MAX_QUEUE_SIZE: "100", C.ENV_EXPORT_DELAY_MS: "50", C.ENV_STORE_FLUSH_S: "2.5"}
    by_arg = C.configure("arg-svc", replica_id="arg-rep", store=tmp_path / "arg", max_queue_size=7,
                         export_delay_ms=5, store_flush_s=0.5, set_global=False, env=env)
    assert {k: by_arg.settings[k] for k in ("service_name", "replica_id", "store", "max_queue_size",
                                            "export_delay_ms", "store_flush_s")} == {
        "service_name": "arg-svc", "replica_id": "arg-rep", "store": tmp_path / "arg", "max_queue_size": 7,
        "export_delay_ms": 5, "store_flush_s": 0.5}
    by_env = C.configure(set_global=False, env=env)
    assert {k: by_env.settings[k] for k in ("service_name", "replica_id", "store", "max_queue_size",
                                            "export_delay_ms", "store_flush_s")} == {
        "service_name": "env-svc", "replica_id": "env-rep", "store": tmp_path / "env", "max_queue_size": 100,
        "export_delay_ms": 50, "store_flush_s": 2.5}
    by_default = C.configure(set_global=False, env={"HOME": str(tmp_path)}, store=tmp_path / "d")
    assert by_default.settings["service_name"] == C.DEFAULTS["service_name"]
    assert by_default.settings["replica_id"] == f"{socket.gethostname()}-{__import__('os').getpid()}"
    assert by_default.settings["exporters"] == ["store"]
    assert by_default.settings["max_queue_size"] == C.DEFAULTS["max_queue_size"]
    assert C.configure(set_global=False, env={"OTEL_SERVICE_NAME": "otel-svc"}, exporters="none") \
        .settings["service_name"] == "otel-svc"
    for t in (by_arg, by_env, by_default):
        t.shutdown()


def test_resource_carries_service_and_replica(tmp_path: Path) -> None:
    telemetry = C.configure("svc", replica_id="replica-7", store=tmp_path, set_global=False)
    assert telemetry.resource.attributes["service.name"] == "svc"
    assert telemetry.resource.attributes["service.instance.id"] == "replica-7"
    telemetry.shutdown()


def test_exporter_choice_and_rules(tmp_path: Path) -> None:
    both = C.configure(exporters="store,otlp", store=tmp_path, otlp_endpoint="http://127.0.0.1:9/v1/traces",
                       set_global=False)
    assert set(both.exporters) == {"store", "otlp"}
    only_otlp = C.configure(otlp_endpoint="127.0.0.1:9", otlp_protocol="grpc", set_global=False, env={})
    assert list(only_otlp.exporters) == ["otlp"] and only_otlp.settings["otlp_protocol"] == "grpc"
    from_env = C.configure(set_global=False, env={C.ENV_EXPORTERS: "none"})
    assert from_env.exporters == {}
    with pytest.raises(ValueError, match="exporters must be among store, otlp, none, got 'kafka'"):
        C.configure(exporters="kafka", set_global=False)
    with pytest.raises(ValueError, match="otlp_protocol must be one of http/protobuf, grpc"):
        C.configure(otlp_protocol="thrift", set_global=False, exporters="none")
    with pytest.raises(ValueError, match="must be > 0"):
        C.configure(max_queue_size=0, set_global=False, exporters="none")
    for t in (both, only_otlp, from_env):
        t.shutdown()


def test_env_vars_are_constants_and_documented() -> None:
    assert C.ENV_STORE == tracing.store.ENV_STORE
    documented = (Path(__file__).parents[2] / "docs" / "settings.md").read_text()
    for name in C.ENV_VARS:
        assert f"`{name}`" in documented, f"{name} is not documented in docs/settings.md"
    constants = {getattr(C, n) for n in dir(C) if n.startswith("ENV_") and n != "ENV_VARS"}
    assert constants == set(C.ENV_VARS)


def test_store_exporter_end_to_end(tmp_path: Path) -> None:
    telemetry = tracing.configure("api", replica_id="replica-3", store=tmp_path / "store")
    with tracing.request(model="m", tenant="acme", input_tokens=3) as req:
        with req.stage(tracing.QUEUE_WAIT):
            pass
        with req.stage(tracing.GENERATION):
            with req.stage(tracing.PREFILL):
                pass
            req.first_token()
            with req.stage(tracing.DECODE):
                pass
        req.set(output_tokens=5)
    assert telemetry.flush()
    row = connect(tmp_path / "store").execute(
        "SELECT status, replica, service, model, tenant, input_tokens, output_tokens, ttft_ns > 0, "
        "queue_wait_ns >= 0, prefill_ns >= 0, decode_ns >= 0 FROM requests").fetchall()
    assert row == [("ok", "replica-3", "api", "m", "acme", 3, 5, True, True, True, True)]
    assert telemetry.stats()["store.exported_spans"] == 5
    telemetry.shutdown()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_dead_otlp_backend_never_raises_and_stays_bounded(caplog: pytest.LogCaptureFixture) -> None:
    port = _closed_port()
    telemetry = tracing.configure("api", exporters="otlp", otlp_endpoint=f"http://127.0.0.1:{port}/v1/traces",
                                  otlp_timeout_s=0.2, max_queue_size=64, export_delay_ms=100000)
    for i in range(200):
        with tracing.request(model="m", tenant=f"t{i}") as req, req.stage(tracing.DECODE):
            pass
        assert telemetry.stats()["queued_spans"] <= 64  # memory stays bounded
    with caplog.at_level(logging.WARNING):
        telemetry.flush()  # the export fails: counted, not raised
        telemetry.flush()
    otlp_errors = [r for r in caplog.records if r.name.startswith("opentelemetry.exporter")]
    assert len(otlp_errors) <= 1  # the exporter's own per-batch error is rate-limited
    stats = telemetry.stats()
    assert stats["dropped_spans"] > 0 and stats["otlp.exported_spans"] == 0
    assert stats["dropped_spans"] + stats["otlp.failed_spans"] == 400 and stats["queued_spans"] == 0
    telemetry.shutdown()


def test_schema_keys_are_the_ones_used() -> None:
    # the public stage constants are the schema's vocabulary, in order
    assert (tracing.NETWORK, tracing.QUEUE_WAIT, tracing.PREPROCESS, tracing.MODEL_LOAD, tracing.GENERATION,
            tracing.STREAMING) == S.STAGES
    assert (tracing.PREFILL, tracing.DECODE) == S.GENERATION_PARTS


def test_unusable_store_does_not_stop_the_host(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the store should be")
    with caplog.at_level(logging.ERROR, logger="tailscope.configure"):
        telemetry = tracing.configure("api", store=blocker)
    assert telemetry.exporters == {} and telemetry.store is None
    assert any("continuing without the store exporter" in r.getMessage() for r in caplog.records)
    with tracing.request(model="m"):
        pass
    telemetry.shutdown()
