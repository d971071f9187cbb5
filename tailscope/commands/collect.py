"""`tailscope collect`: run the OTLP receiver (HTTP and gRPC) that writes durable segments."""

from __future__ import annotations

import inspect
import sys
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from intake.collect.config import COLLECT, CollectConfig, exposure_warning, read_token
from tailscope.commands.common import (
    MappingOption,
    StoreOption,
    errors_as_messages,
    fail,
    read_mapping,
    say,
    store_hooks,
    store_path,
)
from tracing.settings import Setting, SettingsTable

#: Third-party packages the command needs (imported when it runs, so `tailscope --help` starts fast).
NEEDS = ("grpc", "h11", "pyarrow", "numpy", "duckdb", "prometheus_client")

#: Seconds between two looks for settled hours to materialize while collecting.
MATERIALIZE_EVERY_S = 60.0


def setting_options(table: SettingsTable, names: tuple[str, ...] | None = None) -> list[inspect.Parameter]:
    """One parameter (a typer option, passed by keyword) per setting of `table` that names an option
    (only those in `names` when given).

    Name, type, default and help come from the table; a setting with `option_scale` is given on
    the command line in its `option_unit` (the default shown divided by the scale).
    """
    params = []
    for s in table.settings():
        if s.option is None or (names is not None and s.name not in names):
            continue
        unit = f" In {s.option_unit}." if s.option_unit else ""
        default = s.default // s.option_scale if s.option_scale != 1 else s.default
        option: Any = typer.Option(s.option, help=s.help + unit)
        params.append(inspect.Parameter(s.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default,
                                        annotation=Annotated[s.kind, option]))
    return params


def setting_values(table: SettingsTable, options: dict[str, Any]) -> dict[str, Any]:
    """The values of `setting_options` parameters, in the settings' own units."""
    out: dict[str, Any] = {}
    for name, value in options.items():
        setting: Setting[Any] = table[name]
        out[name] = value * setting.option_scale if setting.option_scale != 1 else value
    return out


def collect(
    store: StoreOption = None,
    token_file: Annotated[Path | None, typer.Option(
        "--token-file", help="File holding a bearer token; requests without 'Authorization: Bearer "
        "<token>' are answered 401 (gRPC: UNAUTHENTICATED).", show_default=False)] = None,
    forward_token_file: Annotated[Path | None, typer.Option(
        "--forward-token-file", help="File holding a bearer token sent as 'Authorization: Bearer <token>' "
        "with every --forward request.", show_default=False)] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress line.")] = False,
    mapping: MappingOption = None,
    **options: Any,
) -> None:
    """Receive OTLP traces and store them; a 200 (gRPC OK) means the spans are fsynced to disk.

    With --mapping FILE the mapping is saved in the store first, as `tailscope map` does.

    Prints 'listening http=HOST:PORT grpc=HOST:PORT' once ready, then a progress line
    (spans/s, stored, segments, rejected, duplicates, queue depth, p99 commit latency).
    SIGTERM or Ctrl-C stops cleanly: in-flight requests are answered and the queue is written.

    Limits besides the options below (docs/collect.md, "Limits and errors"): OTLP/JSON nested
    deeper than 64 levels gets 400; a request refused before its body is read is answered, then
    its connection is drained for at most 2 s and closed; gRPC calls without the token are
    refused on one thread of their own, at most 64 waiting at once (more are answered
    UNIMPLEMENTED by grpcio without a thread), and never take an authenticated call's slot.
    """
    from intake.collect.receiver import Receiver

    token = _token(token_file, "--token-file")
    forward_token = _token(forward_token_file, "--forward-token-file")
    try:
        values = setting_values(COLLECT, options)
        for port in ("http_port", "grpc_port", "metrics_port"):  # -1 on the command line turns a protocol off
            if values.get(port) is not None and values[port] < 0:
                values[port] = None
        config = CollectConfig(store=store_path(store), token=token, forward_token=forward_token, **values)
    except ValueError as exc:
        fail(str(exc))
    warning = exposure_warning(config)
    if warning:
        sys.stderr.write(f"warning: {warning}\n")
    rules = read_mapping(mapping) if mapping is not None else None
    with errors_as_messages():
        try:
            on_removed, extra_bytes = store_hooks(config.store)
            receiver = Receiver(config, on_hour_removed=on_removed, hour_extra_bytes=extra_bytes, say=say)
        except ValueError as exc:  # a --forward URL that is not one
            fail(str(exc))
        if rules is not None:  # saved in the store: its materialized hours and every reader use it (tailscope map)
            from analysis.mapping.rules import save

            save(config.store, rules)

    served: list[Any] = []

    def ready(r: Receiver) -> None:
        parts = []
        if r.span_metrics is not None:
            served.append(_serve_metrics(r, config))
            parts.append(f"metrics={config.host}:{served[0].port}")
        if r.http_port is not None:
            parts.append(f"http={config.host}:{r.http_port}")
        if r.grpc_port is not None:
            parts.append(f"grpc={config.host}:{r.grpc_port}")
        forwarding = f" forward={config.forward}" if config.forward else ""
        sys.stderr.write(f"listening {' '.join(parts)} store={config.store}{forwarding} "
                         f"(dedupe: {r.loaded_keys:,} recent keys loaded)\n")
        if r.replayed.files:
            sys.stderr.write(f"journal: {r.replayed.files} file(s) left by a stopped receiver replayed, "
                             f"{r.replayed.spans:,} acknowledged spans, {r.replayed.stored:,} of them stored now "
                             "(the rest were in segments)\n")
        sys.stderr.flush()

    stop = threading.Event()
    builder = threading.Thread(target=_materialize_settled, args=(config.store, stop), daemon=True,
                               name="tailscope-materialize")
    builder.start()
    try:
        stats = receiver.serve_forever(progress=None if quiet else sys.stderr, on_ready=ready)
    except OSError as exc:
        fail(f"could not listen: {exc}")
    finally:
        stop.set()
        for server in served:
            server.stop()
    forwarded = ""
    if receiver.forwarder is not None:
        f = receiver.forwarder
        forwarded = f", {f.forwarded_spans:,} forwarded, {f.dropped_spans:,} not forwarded (dropped)"
    sys.stderr.write(f"stopped: {stats.stored_spans:,} spans stored in {stats.segments:,} segment(s), "
                     f"{stats.duplicate_spans:,} duplicates dropped, {stats.rejected_spans:,} rejected{forwarded}\n")


def _serve_metrics(receiver: Any, config: CollectConfig) -> Any:
    """/metrics of a started receiver: its span histograms and its own health (tailscope.commands.metrics)."""
    from intake.collect.metrics import ReceiverMetrics, compaction_hooks
    from tailscope.commands.metrics import serve_metrics

    hooks = compaction_hooks(receiver.compactor) if receiver.compactor is not None else []
    return serve_metrics([ReceiverMetrics(receiver, hooks)], config.host, config.metrics_port or 0, config.token,
                         renderers=[receiver.span_metrics.render])


def _token(path: Path | None, option: str) -> str | None:
    """The bearer token in the file `option` names (None without one); a bad file ends the command."""
    if path is None:
        return None
    try:
        return read_token(path)
    except (OSError, ValueError) as exc:
        fail(f"{option}: {exc}")


def _materialize_settled(store: Path, stop: threading.Event) -> None:
    """Every MATERIALIZE_EVERY_S, write the requests of hours that settled (analysis.engine.materialize).

    Runs beside the receiver, never in its way: one DuckDB thread, and a failure is one line
    on stderr (queries compute unmaterialized hours on the fly, so nothing depends on this).
    analysis.engine.materialize (polars, DuckDB, the request model) is imported at the first look, not
    at startup: the import costs about half a CPU second, which used to land on the receiver's
    first seconds and showed in bench_collect's short rows (docs/benchmarks.md).
    """
    while not stop.wait(MATERIALIZE_EVERY_S):
        from analysis.engine.materialize import SETTLE_NS, materialize

        try:
            materialize(store, settled_before_ns=time.time_ns() - SETTLE_NS, threads=1, memory_limit="2GB")
        except Exception as exc:  # telemetry intake must not die of a derived file
            sys.stderr.write(f"materialize: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}\n")


# the command's parameters: --store, then the table's options, then --token-file and --quiet
_own = [p for p in inspect.signature(collect, eval_str=True).parameters.values()
        if p.kind is not inspect.Parameter.VAR_KEYWORD]
collect.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [_own[0], *setting_options(COLLECT), *_own[1:]])
collect.__annotations__ = {p.name: p.annotation for p in collect.__signature__.parameters.values()}  # type: ignore[attr-defined]


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("collect")(collect)
