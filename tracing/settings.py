"""Settings: one table per component, one entry per setting (name, type, default, variable, help).

A table is a `SettingsTable` subclass whose class attributes are `Setting`s (the attribute
name is the setting's name, the order is the documented order). Code reads a setting with
`TABLE.entry.resolve(argument, env)`: the argument if given, else the environment variable,
else the default; a malformed value raises `SettingError`, one line naming the variable.
docs/settings.md is generated from the tables (`python -m tailscope.settings_docs`) and a
test fails when it is stale or when a setting is never read.

The serving side's table (`SERVING`: `tracing.configure`, `tracing.LeanRecorder`, the store
directory) lives here, below configure, lean and store, so that all of them read one owner.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Final, Generic, TypeVar

from tracing import schema as S
from tracing.errors import TailscopeError

__all__ = [
    "OTLP_GRPC_ENDPOINT",
    "OTLP_HTTP_ENDPOINT",
    "SERVING",
    "ServingSettings",
    "Setting",
    "SettingError",
    "SettingsTable",
    "render_markdown",
]

T = TypeVar("T")

_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})
_TYPE_NAMES: Final[dict[type, str]] = {int: "integer", float: "number", str: "text", bool: "true/false",
                                        Path: "path"}


class SettingError(TailscopeError, ValueError):
    """A setting's value cannot be used; the message is one line naming the variable and the value."""


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One setting: the type (`kind`) its text is parsed as, its default, its help and where else it comes from.

    `env` is the environment variable (None: not settable from the environment) and
    `env_fallbacks` are read after it (e.g. OTEL_SERVICE_NAME). A default computed at run time
    is a `default_factory` with a `default_doc` saying what it is. `option` is the command-line
    option when the component has a command (`option_scale`: command-line unit in base units).
    """

    kind: type
    default: T
    help: str
    env: str | None = None
    env_fallbacks: tuple[str, ...] = ()
    default_factory: Callable[[], T] | None = None
    default_doc: str | None = None
    option: str | None = None
    option_scale: int = 1
    option_unit: str = ""
    name: str = field(default="", init=False)

    def __post_init__(self) -> None:
        if self.kind not in _TYPE_NAMES:
            raise TypeError(f"setting type must be one of {sorted(t.__name__ for t in _TYPE_NAMES)}")
        if self.default_factory is not None and not self.default_doc:
            raise TypeError("a setting with a default_factory needs a default_doc saying what the default is")

    def __set_name__(self, owner: type, name: str) -> None:
        object.__setattr__(self, "name", name)

    @property
    def variables(self) -> tuple[str, ...]:
        """The environment variables read, in order."""
        return ((self.env,) if self.env else ()) + self.env_fallbacks

    def raw(self, env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
        """(variable, text) of the first variable set to a non-blank value, else None."""
        environ = os.environ if env is None else env
        for variable in self.variables:
            text = environ.get(variable)
            if text is not None and text.strip():
                return variable, text.strip()
        return None

    def parse(self, text: str, source: str | None = None) -> T:
        """`text` as this setting's type; SettingError naming `source` (default: the variable) if malformed."""
        kind: Any = self.kind
        try:
            if kind is bool:
                low = text.strip().lower()
                if low not in _TRUE | _FALSE:
                    raise ValueError(text)
                return low in _TRUE  # type: ignore[return-value]
            if kind is Path:
                return Path(text).expanduser()  # type: ignore[return-value]
            return kind(text)  # type: ignore[no-any-return]
        except ValueError:
            where = source or self.env or self.name
            raise SettingError(f"{where}={text!r} is not a valid {_TYPE_NAMES[self.kind]} "
                               f"(setting {self.name}: {self.help.split(';')[0].rstrip('.')})") from None

    def default_value(self) -> T:
        """The default (computed now when it is a factory)."""
        return self.default_factory() if self.default_factory is not None else self.default

    def resolve(self, argument: T | None = None, env: Mapping[str, str] | None = None) -> T:
        """The argument if not None, else the environment variable (parsed), else the default."""
        if argument is not None:
            return argument
        found = self.raw(env)
        if found is None:
            return self.default_value()
        return self.parse(found[1], found[0])

    def resolve_or_default(self, argument: T | None, env: Mapping[str, str] | None, log: logging.Logger) -> T:
        """As `resolve`, but a malformed variable is logged (one line) and the default used instead.

        For code running inside someone else's process (telemetry never crashes the host).
        """
        try:
            return self.resolve(argument, env)
        except SettingError as exc:
            log.warning("tailscope: %s; using the default", exc)
            return self.default_value()

    def shown_default(self) -> str:
        """The default as the docs show it."""
        if self.default_doc:
            return self.default_doc
        value: Any = self.default
        if value is None:
            return "none"
        if isinstance(value, bool):
            return "true" if value else "false"
        return f"`{value}`"


class SettingsTable:
    """A component's settings: subclass with one `Setting` class attribute per setting, in docs order.

    `title` heads the component's docs section, `intro` says who reads the table and how, and
    `readers` names the modules that read its settings (a test checks every setting is read there).
    """

    title: ClassVar[str] = ""
    intro: ClassVar[str] = ""
    readers: ClassVar[tuple[str, ...]] = ()

    def settings(self) -> tuple[Setting[Any], ...]:
        """Every setting of the table, in definition order."""
        seen: dict[str, Setting[Any]] = {}
        for klass in reversed(type(self).__mro__):
            for name, value in vars(klass).items():
                if isinstance(value, Setting):
                    seen[name] = value
        return tuple(seen.values())

    def __getitem__(self, name: str) -> Setting[Any]:
        for setting in self.settings():
            if setting.name == name:
                return setting
        raise KeyError(name)

    def defaults(self) -> dict[str, Any]:
        """name -> default of every setting with a fixed default."""
        return {s.name: s.default for s in self.settings() if s.default_factory is None}

    def env_vars(self) -> dict[str, Setting[Any]]:
        """Environment variable -> setting, for the settings that have one."""
        return {s.env: s for s in self.settings() if s.env}


# --- the serving side -----------------------------------------------------------------------

#: Where OTLP goes by default (the `tailscope collect` ports).
OTLP_HTTP_ENDPOINT: Final = "http://127.0.0.1:4318/v1/traces"
OTLP_GRPC_ENDPOINT: Final = "127.0.0.1:4317"


def _replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _home_store() -> Path:
    return Path.home() / ".local" / "share" / "tailscope" / "store"


class ServingSettings(SettingsTable):
    """Settings of instrumented serving code."""

    title = "Serving side"
    intro = ("Read by `tracing.configure(...)` (each keyword argument has the setting's name) and by "
             "`tracing.LeanRecorder` (`service_name`, `replica_id`): the argument if given, else the "
             "environment variable, else the default. A malformed number in a variable is logged and "
             "replaced by the default (telemetry never stops the host); a value that breaks a rule "
             "(an unknown exporter or protocol, a size <= 0) raises `ValueError`. `store` is also the "
             "store every `tailscope` command and the dashboard read by default.")
    readers = ("tracing.configure", "tracing.lean", "tracing.store")

    service_name: Setting[str] = Setting(
        str, "tailscope-service", "service name (resource `service.name`)",
        env="TAILSCOPE_SERVICE_NAME", env_fallbacks=("OTEL_SERVICE_NAME",))
    replica_id: Setting[str] = Setting(
        str, "", "replica id (resource `service.instance.id`, the `replica` column)",
        env="TAILSCOPE_REPLICA_ID", default_factory=_replica_id, default_doc="`<hostname>-<pid>`")
    exporters: Setting[str | None] = Setting(
        str, None, "comma-separated exporters: `store`, `otlp`, `none`",
        env="TAILSCOPE_EXPORTERS", default_doc="`store` (`otlp` when an OTLP endpoint is given)")
    store: Setting[Path] = Setting(
        Path, Path(), "segment store directory (the store exporter writes there; the CLI reads it)",
        env="TAILSCOPE_STORE", default_factory=_home_store, default_doc="`~/.local/share/tailscope/store`")
    otlp_endpoint: Setting[str | None] = Setting(
        str, None, "OTLP endpoint: a URL for http/protobuf, host:port for grpc",
        env="TAILSCOPE_OTLP_ENDPOINT", default_doc=f"`{OTLP_HTTP_ENDPOINT}` (grpc: `{OTLP_GRPC_ENDPOINT}`)")
    otlp_protocol: Setting[str] = Setting(
        str, "http/protobuf", "OTLP protocol: `http/protobuf` or `grpc`", env="TAILSCOPE_OTLP_PROTOCOL")
    otlp_timeout_s: Setting[float] = Setting(
        float, 10.0, "seconds one OTLP export may take, retries included", env="TAILSCOPE_OTLP_TIMEOUT_SECONDS")
    max_queue_size: Setting[int] = Setting(
        int, 8192, "most finished spans held for export; beyond it the oldest is dropped and counted",
        env="TAILSCOPE_MAX_QUEUE_SIZE")
    export_delay_ms: Setting[int] = Setting(
        int, 1000, "milliseconds between two exports of the span queue", env="TAILSCOPE_EXPORT_DELAY_MS")
    store_flush_s: Setting[float] = Setting(
        float, 5.0, "seconds the store exporter buffers rows before writing a segment",
        env="TAILSCOPE_STORE_FLUSH_SECONDS")


#: The serving side's settings table.
SERVING: Final = ServingSettings()


class RowSettings(SettingsTable):
    """Settings of turning spans into stored rows (every writer: store exporter, lean recorder, ingest, collect)."""

    title = "Stored rows"
    intro = ("Read by `tracing.rows` wherever spans become rows of the store (the store exporter, the lean "
             "recorder, `tailscope ingest`, `tailscope collect`): the environment variable, else the default.")
    readers = ("tracing.rows",)

    replica_keys: Setting[str] = Setting(
        str, ",".join(S.REPLICA_RESOURCE_KEYS), "comma-separated resource keys tried, in order, for the replica "
        "(docs/convention.md#replica)", env="TAILSCOPE_REPLICA_KEYS")


#: The stored rows' settings table.
ROWS: Final = RowSettings()


# --- docs ----------------------------------------------------------------------------------

def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(tables: Sequence[SettingsTable], generator: str) -> str:
    """docs/settings.md: one section per table, one row per setting."""
    out = ["# Settings", "",
           f"Generated by `{generator}` from the settings tables (`tracing.settings`);",
           "a test fails when this file is stale, when a setting is missing here or when a setting is never read.",
           "Each component's table is the one owner of its settings' names, defaults, variables and help.", ""]
    for table in tables:
        klass = type(table)
        out += [f"## {table.title}", "", f"Table: `{klass.__module__}.{klass.__name__}`. {table.intro}", "",
                "| setting | type | default | environment variable | option | meaning |",
                "|---|---|---|---|---|---|"]
        for s in table.settings():
            env = " then ".join(f"`{v}`" for v in s.variables) or "-"
            option = f"`{s.option}`" + (f" ({s.option_unit})" if s.option_unit else "") if s.option else "-"
            out.append(f"| `{s.name}` | {_TYPE_NAMES[s.kind]} | {_cell(s.shown_default())} | {env} | {option} "
                       f"| {_cell(s.help)} |")
        out.append("")
    return "\n".join(out)
