"""`tailscope watch`: alert on p99 spikes (with their cause) and SLO rules, live or as a replay over stored data."""

from __future__ import annotations

import contextlib
import faulthandler
import json
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tailscope.commands.common import StoreOption, console, errors_as_messages, fail, store_path
from tailscope.commands.report import Metric
from tracing.errors import QueryError
from tracing.store import require_store

if TYPE_CHECKING:
    from analysis.watch import Config

#: Third-party packages the command needs (imported when it runs, so `tailscope --help` starts fast).
NEEDS = ("duckdb", "polars", "numpy", "pyarrow")


def _out(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def watch(
    store: StoreOption = None,
    metric: Annotated[Metric, typer.Option("--metric", "-m", help="Latency whose p99 spikes are alerted on.")
                      ] = Metric.e2e,
    window: Annotated[str | None, typer.Option(
        "--window", "-w", help="Window evaluated at each tick, e.g. 30s, 1m (default: chosen from the request "
                               "rate as the report chooses it; live: over the last hour, kept across restarts).",
        show_default=False)] = None,
    delay: Annotated[str, typer.Option(
        "--delay", help="Evaluate a window this long after it closes (requests started in it must have ended and "
                        "been stored by then), e.g. 60s.")] = "60s",
    lookback: Annotated[int, typer.Option("--lookback", help="Windows kept as the baseline (at least 4).")] = 60,
    rules: Annotated[Path | None, typer.Option(
        "--rules", help="SLO rules file (docs/watch.md), e.g. lines `p99(ttft) < 2s`.", show_default=False)] = None,
    webhook: Annotated[list[str] | None, typer.Option(
        "--webhook", help="POST each fire / resolve as JSON to this URL (repeatable).", show_default=False)] = None,
    alertmanager: Annotated[list[str] | None, typer.Option(
        "--alertmanager", help="Alertmanager base URL; alerts go to POST /api/v2/alerts (repeatable).",
        show_default=False)] = None,
    dashboard_url: Annotated[str | None, typer.Option(
        "--dashboard-url", help="Base URL of the dashboard, for each alert's link to its Spike page.",
        show_default=False)] = None,
    ok_only: Annotated[bool, typer.Option(
        "--ok-only", help="Leave errors, timeouts and cancellations out of the percentiles.")] = False,
    replay_mode: Annotated[bool, typer.Option(
        "--replay", help="Backtest: evaluate stored windows as if live and print the alerts; delivers nothing "
                         "(--webhook and --alertmanager are refused with it).")
                           ] = False,
    since: Annotated[str | None, typer.Option(
        "--since", help="Replay from this time (ISO-8601, UTC if no zone; default: the first request).",
        show_default=False)] = None,
    until: Annotated[str | None, typer.Option(
        "--until", help="Replay until this time (default: the last request).", show_default=False)] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Replay: print one JSON object per alert (docs/watch.md) instead of text.")] = False,
    once: Annotated[bool, typer.Option(
        "--once", help="Live: evaluate the windows due now, deliver, and exit.")] = False,
    poll: Annotated[str, typer.Option("--poll", help="Live: longest sleep between checks.")] = "5s",
    metrics_port: Annotated[int | None, typer.Option(
        "--metrics-port", help="Live: serve the watch's health on GET /metrics (OpenMetrics) on this port; "
                               "0 picks a free one (docs/metrics.md).", show_default=False)] = None,
    metrics_host: Annotated[str, typer.Option(
        "--metrics-host", help="Live: address of /metrics. Loopback by default.")] = "127.0.0.1",
    metrics_token_file: Annotated[Path | None, typer.Option(
        "--metrics-token-file", help="Live: file holding a bearer token scrapes of /metrics must send.",
        show_default=False)] = None,
) -> None:
    """Alert when p99 breaks away with a flat median (with its cause), or an SLO rule breaks; or backtest it."""
    from analysis.engine.percentiles import parse_duration
    from analysis.watch import Config, load_rules
    from analysis.watch.delivery import receivers_from

    with errors_as_messages():
        if replay_mode and (webhook or alertmanager):
            raise QueryError("", "--replay delivers nothing: drop --webhook / --alertmanager, or run the live watch")
        config = Config(metric=metric.value, window_s=parse_duration(window) if window else 60.0,
                        delay_s=0.0 if delay.strip() in ("0", "0s") else parse_duration(delay),
                        lookback=lookback, rules=load_rules(rules) if rules else [],
                        include_failures=not ok_only, dashboard_url=dashboard_url)
        config.check()
        path = require_store(store_path(store))
        if replay_mode:
            _replay(path, config, since, until, as_json, auto_window=window is None)
            return
        if since or until or as_json:
            raise QueryError("", "--since, --until and --json apply to --replay only")
        metrics = _metrics_options(metrics_port, metrics_host, metrics_token_file)
        if window is None:
            from analysis.watch.live import live_window_s
            config.window_s = live_window_s(path, time.time_ns(), config.delay_s)
        _live(path, config, receivers_from(webhook or [], alertmanager or []), once, parse_duration(poll), metrics)


def _replay(path: Path, config: Config, since: str | None, until: str | None, as_json: bool,
            auto_window: bool) -> None:
    import duckdb

    from analysis.engine.connect import connect
    from analysis.engine.percentiles import auto_window_s, parse_time, request_facts, time_range
    from analysis.watch import Event, replay, replay_json, summary_line

    since_ns, until_ns = parse_time(since), parse_time(until)
    con = connect(path)
    try:
        con.execute("SET enable_progress_bar = false").fetchall()
        lo, hi, n = time_range(con, since_ns, until_ns, request_facts(con))
    except duckdb.Error as exc:
        fail(f"replay failed: {str(exc).splitlines()[0]}")
    finally:
        con.close()
    if n == 0:
        fail("no request in the store for that range: nothing to replay")
    since_ns = since_ns if since_ns is not None else lo
    until_ns = until_ns if until_ns is not None else hi + 1
    if until_ns <= since_ns:
        fail("--until must be after --since")
    if auto_window:  # the report's choice for this range (percentiles.choose_window_s)
        config.window_s = float(auto_window_s(n, (until_ns - since_ns) / 1e9))

    def show(ev: Event) -> None:
        if not as_json:
            _out(summary_line(ev))

    try:
        alerts = replay(path, config, since_ns, until_ns, on_event=show)
    except duckdb.Error as exc:
        fail(f"replay failed: {str(exc).splitlines()[0]}")
    if as_json:
        for alert in alerts:
            _out(json.dumps(replay_json(alert)))
    elif not alerts:
        console.print("no alert would have fired", highlight=False)


def _metrics_options(port: int | None, host: str, token_file: Path | None) -> tuple[int, str, str | None] | None:
    """(port, host, token) of the watch's /metrics, or None when off; a bad token file ends the command."""
    if port is None:
        if token_file is not None:
            raise QueryError("", "--metrics-token-file needs --metrics-port")
        return None
    from tailscope.commands.metrics import scrape_token

    return port, host, scrape_token(token_file, "--metrics-token-file", host)


def _live(path: Path, config: Config, receivers: Any, once: bool, poll_s: float,
          metrics: tuple[int, str, str | None] | None = None) -> None:
    import duckdb

    from analysis.watch import Event, LiveWatch, summary_line
    from analysis.watch.delivery import Deliverer, Outbox
    from analysis.watch.health import WatchHealth

    outbox = Outbox(path, receivers)
    deliverer = Deliverer(outbox)
    stopping = {"now": False}

    def stop(_signum: int, _frame: Any) -> None:
        stopping["now"] = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    if hasattr(signal, "SIGUSR1"):  # `kill -USR1 PID` prints every thread's stack to stderr: what is it doing?
        with contextlib.suppress(ValueError, OSError, AttributeError):  # no real stderr (embedded): skip
            faulthandler.register(signal.SIGUSR1, all_threads=True)

    def deliver(ev: Event) -> None:
        outbox.enqueue(ev)
        _out(summary_line(ev))

    live = LiveWatch(path, config, deliver)
    health = WatchHealth(live, deliverer)
    server = None
    if metrics is not None:
        from tailscope.commands.metrics import serve_metrics
        try:
            server = serve_metrics([health], metrics[1], metrics[0], metrics[2])
        except OSError as exc:
            fail(f"could not listen for /metrics: {exc}")
    deliverer.start()
    served = f" · metrics={metrics[1]}:{server.port}" if server is not None and metrics is not None else ""
    _out(f"watching {path} · {config.metric} · window {config.window_s:g} s · delay {config.delay_s:g} s · "
         f"{len(config.slo_rules)} rule(s) · {len(receivers)} receiver(s){served}")
    try:
        while not stopping["now"]:
            began = time.monotonic()
            try:
                live.step(time.time_ns())
                health.evaluated(time.monotonic() - began)
            except duckdb.Error as exc:  # a segment being compacted away, a full disk: retry next tick
                health.evaluated(time.monotonic() - began, ok=False)
                print(f"tailscope watch: evaluation failed ({str(exc).splitlines()[0]}); retrying",
                      file=sys.stderr)
            deliverer.wake()
            deliverer.refresh(list(live.watcher.active.values()))
            if once:
                break
            wait_s = max(0.05, min(poll_s, (live.next_due_ns() - time.time_ns()) / 1e9))
            deadline = time.monotonic() + wait_s
            while not stopping["now"] and time.monotonic() < deadline:
                time.sleep(min(0.1, wait_s))
    finally:
        deliverer.stop(drain_s=10.0 if once else 2.0)
        if server is not None:
            server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("watch")(watch)
