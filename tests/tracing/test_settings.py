"""tracing.settings: argument > environment > default, typed parsing, one-line errors; readers use it."""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import os
import socket
from pathlib import Path

import pytest

from intake.collect.config import COLLECT, CollectConfig
from intake.engines import triton
from intake.engines.settings import ENGINES
from tracing.errors import InputError
from tracing.lean import LeanRecorder
from tracing.settings import SERVING, Setting, SettingError, SettingsTable

C = importlib.import_module("tracing.configure")  # the module (tracing.configure is the function)


class _Table(SettingsTable):
    title = "test"
    count: Setting[int] = Setting(int, 3, "how many; more help", env="T_COUNT", env_fallbacks=("T_COUNT_OLD",))
    ratio: Setting[float] = Setting(float, 0.5, "a ratio", env="T_RATIO")
    flag: Setting[bool] = Setting(bool, False, "a flag", env="T_FLAG")
    where: Setting[Path] = Setting(Path, Path("/x"), "a path", env="T_WHERE")
    label: Setting[str] = Setting(str, "", "a label", env="T_LABEL", default_factory=lambda: "made",
                                  default_doc="made at run time")
    plain: Setting[int] = Setting(int, 7, "no variable")


T = _Table()


def test_names_come_from_the_attributes_in_order() -> None:
    assert [s.name for s in T.settings()] == ["count", "ratio", "flag", "where", "label", "plain"]
    assert T["ratio"] is _Table.ratio
    assert set(T.env_vars()) == {"T_COUNT", "T_RATIO", "T_FLAG", "T_WHERE", "T_LABEL"}
    assert T.defaults() == {"count": 3, "ratio": 0.5, "flag": False, "where": Path("/x"), "plain": 7}


def test_argument_beats_environment_beats_fallback_beats_default() -> None:
    assert T.count.resolve(9, {"T_COUNT": "5", "T_COUNT_OLD": "4"}) == 9
    assert T.count.resolve(None, {"T_COUNT": "5", "T_COUNT_OLD": "4"}) == 5
    assert T.count.resolve(None, {"T_COUNT_OLD": "4"}) == 4
    assert T.count.resolve(None, {"T_COUNT": "  ", "T_COUNT_OLD": ""}) == 3  # blank counts as unset
    assert T.count.resolve(0, {"T_COUNT": "5"}) == 0  # a falsy argument is still an argument
    assert T.label.resolve(None, {}) == "made" and T.label.resolve(None, {"T_LABEL": "x"}) == "x"
    assert T.plain.resolve(None, {"PLAIN": "1"}) == 7


def test_values_are_parsed_as_their_type() -> None:
    env = {"T_COUNT": " 12 ", "T_RATIO": "2.25", "T_WHERE": "~/store"}
    assert T.count.resolve(None, env) == 12
    assert T.ratio.resolve(None, env) == 2.25
    assert T.where.resolve(None, env) == Path.home() / "store"
    for text, value in (("1", True), ("TRUE", True), ("yes", True), ("on", True),
                        ("0", False), ("false", False), ("No", False), ("off", False)):
        assert T.flag.resolve(None, {"T_FLAG": text}) is value


@pytest.mark.parametrize(("setting", "text", "kind"), [
    (_Table.count, "12x", "integer"), (_Table.ratio, "half", "number"), (_Table.flag, "maybe", "true/false")])
def test_a_bad_value_is_one_line_naming_the_variable(setting: Setting[object], text: str, kind: str) -> None:
    with pytest.raises(SettingError) as info:
        setting.resolve(None, {str(setting.env): text})
    message = str(info.value)
    assert message.startswith(f"{setting.env}={text!r} is not a valid {kind} (setting {setting.name}")
    assert "\n" not in message


def test_a_bad_fallback_names_the_fallback() -> None:
    with pytest.raises(SettingError, match=r"^T_COUNT_OLD='many' is not a valid integer \(setting count: how many\)$"):
        T.count.resolve(None, {"T_COUNT_OLD": "many"})


def test_lenient_resolution_logs_and_uses_the_default(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("tailscope.test")
    with caplog.at_level(logging.WARNING, logger="tailscope.test"):
        assert T.count.resolve_or_default(None, {"T_COUNT": "lots"}, log) == 3
    assert [r.getMessage() for r in caplog.records] == [
        "tailscope: T_COUNT='lots' is not a valid integer (setting count: how many); using the default"]


def test_a_computed_default_needs_its_docs() -> None:
    with pytest.raises(TypeError, match="default_doc"):
        Setting(str, "", "x", default_factory=lambda: "y")
    with pytest.raises(TypeError, match="setting type"):
        Setting(list, [], "x")


def test_configure_logs_a_bad_number_and_keeps_the_default(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="tailscope.configure"):
        telemetry = C.configure(set_global=False, exporters="none", env={"TAILSCOPE_MAX_QUEUE_SIZE": "8k"})
    assert telemetry.settings["max_queue_size"] == SERVING.max_queue_size.default == 8192
    assert [r.getMessage() for r in caplog.records] == [
        "tailscope: TAILSCOPE_MAX_QUEUE_SIZE='8k' is not a valid integer (setting max_queue_size: most finished "
        "spans held for export); using the default"]
    telemetry.shutdown()


def test_configure_keywords_are_the_serving_settings() -> None:
    keywords = set(inspect.signature(C.configure).parameters)
    assert {s.name for s in SERVING.settings()} <= keywords
    assert {s.env: (s.shown_default(), s.help) for s in SERVING.settings() if s.env} == C.ENV_VARS


def test_lean_recorder_reads_service_and_replica(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("TAILSCOPE_SERVICE_NAME", raising=False)
    monkeypatch.delenv("TAILSCOPE_REPLICA_ID", raising=False)
    default = LeanRecorder(tmp_path, background=False)
    assert default.resource == {"service.name": "tailscope-service",
                                "service.instance.id": f"{socket.gethostname()}-{os.getpid()}"}
    monkeypatch.setenv("OTEL_SERVICE_NAME", "otel-api")
    assert LeanRecorder(tmp_path, background=False).service == "otel-api"
    monkeypatch.setenv("TAILSCOPE_SERVICE_NAME", "env-api")
    monkeypatch.setenv("TAILSCOPE_REPLICA_ID", "env-replica")
    by_env = LeanRecorder(tmp_path, background=False)
    assert (by_env.service, by_env.replica) == ("env-api", "env-replica")
    by_arg = LeanRecorder(tmp_path, service_name="arg-api", replica_id="arg-replica", background=False)
    assert (by_arg.service, by_arg.replica) == ("arg-api", "arg-replica")


def test_collect_config_has_one_field_per_setting_with_its_default(tmp_path: Path) -> None:
    config = CollectConfig(store=tmp_path)
    fields = {name: getattr(config, name) for name in CollectConfig.__dataclass_fields__}
    # the bearer tokens are read from files (--token-file, --forward-token-file), never a setting or variable
    assert set(fields) - {"store", "token", "forward_token"} == {s.name for s in COLLECT.settings()}
    for s in COLLECT.settings():
        assert fields[s.name] == s.default and type(fields[s.name]) is s.kind, s.name


def test_triton_clock_offset_comes_from_the_engines_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps([]))
    assert triton.ENV_CLOCK_OFFSET == ENGINES.triton_clock_offset_ns.env == "TAILSCOPE_TRITON_CLOCK_OFFSET_NS"
    monkeypatch.setenv(triton.ENV_CLOCK_OFFSET, "-250")
    assert triton.clock_offset(path, 1000) == -250
    monkeypatch.setenv(triton.ENV_CLOCK_OFFSET, "")
    assert triton.clock_offset(path, 1000) == path.stat().st_mtime_ns - 1000
    monkeypatch.setenv(triton.ENV_CLOCK_OFFSET, "1.5e9")
    with pytest.raises(InputError, match=r"TAILSCOPE_TRITON_CLOCK_OFFSET_NS='1\.5e9' is not a valid integer"):
        triton.clock_offset(path, 1000)
