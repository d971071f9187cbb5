"""`tailscope metrics`: span latency histograms on /metrics for a store filled otherwise; the /metrics server.

`serve_metrics` is the one HTTP server of /metrics (collect, watch and this command use it):
OpenMetrics when the scraper asks for it (Prometheus does; exemplars need it), the classic text
format otherwise; with a token, a scrape without 'Authorization: Bearer <token>' gets 401.
"""

from __future__ import annotations

import hmac
import sys
import threading
import time
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Annotated, Any

import typer

from tailscope.commands.common import StoreOption, errors_as_messages, fail, store_path
from tracing.store import require_store

#: Third-party packages the command needs (imported when it runs, so `tailscope --help` starts fast).
NEEDS = ("prometheus_client", "pyarrow", "numpy")


class MetricsServer:
    """A running /metrics endpoint: its port, and `stop()`."""

    def __init__(self, server: ThreadingHTTPServer, thread: threading.Thread) -> None:
        self.server = server
        self.thread = thread
        self.port: int = server.server_address[1]

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self.server.shutdown()
        self.server.server_close()


def serve_metrics(collectors: Iterable[Any], host: str, port: int, token: str | None = None,
                  renderers: Iterable[Callable[[bool], bytes]] = ()) -> MetricsServer:
    """Serve GET /metrics on host:port (0: a free port), in a daemon thread: what each renderer writes
    (`render(openmetrics)`: SpanMetrics.render), then the prometheus_client collectors' families."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import choose_encoder

    registry = CollectorRegistry(auto_describe=False)
    for c in collectors:
        registry.register(c)
    expected = token.encode() if token else None
    fast = list(renderers)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] != "/metrics":
                self._answer(404, b"only /metrics here\n", "text/plain")
                return
            if expected is not None:
                scheme, _, given = (self.headers.get("Authorization") or "").strip().partition(" ")
                if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
                    self._answer(401, b"missing or wrong bearer token\n", "text/plain")
                    return
            encoder, content_type = choose_encoder(self.headers.get("Accept") or "")
            openmetrics = content_type.startswith("application/openmetrics-text")
            try:
                body = b"".join(r(openmetrics) for r in fast) + encoder(registry)
            except Exception as exc:  # a collector failing: say it, keep serving
                self._answer(500, f"metrics failed: {exc}\n".encode(), "text/plain")
                return
            self._answer(200, body, content_type)

        def _answer(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="tailscope-metrics", daemon=True)
    thread.start()
    return MetricsServer(server, thread)


def exposure_warning(host: str, token: str | None) -> str | None:
    """A warning when /metrics listens beyond loopback without a token (None otherwise)."""
    from intake.collect.config import is_loopback

    if token or is_loopback(host):
        return None
    return (f"/metrics listens on {host} without a token: anyone who can reach this machine can read "
            "the latency figures and trace ids; give --token-file, or keep the default --host 127.0.0.1")


def scrape_token(token_file: Path | None, option: str, host: str) -> str | None:
    """The bearer token scrapes must send (None without a file), with the exposure warning on stderr;
    a bad token file ends the command in one line naming `option`."""
    from intake.collect.config import read_token

    token = None
    if token_file is not None:
        try:
            token = read_token(token_file)
        except (OSError, ValueError) as exc:
            fail(f"{option}: {exc}")
    warning = exposure_warning(host, token)
    if warning:
        sys.stderr.write(f"warning: {warning}\n")
    return token


class StoreTail:
    """Feeds a SpanMetrics with the segments that appear in a store (each segment once)."""

    def __init__(self, store: Path, metrics: Any, *, from_start: bool) -> None:
        from tracing.store import segment_files

        self.store = store
        self.metrics = metrics
        self.seen: set[str] = set() if from_start else {str(p) for p in segment_files(store)}

    def _counted(self, path: Path, depth: int = 0) -> bool:
        """Whether every span of a compacted segment was observed already: each segment it replaces (its record,
        read through merged segments this tail never listed, kept on disk for the compactor's grace) was."""
        from tracing.store import read_record, segment_level

        if segment_level(path.name) == 0 or depth > 16:
            return False
        record = read_record(path)
        inputs = record.get("inputs") if record else None
        if not inputs:
            return False
        return all(str(path.parent / name) in self.seen or self._counted(path.parent / name, depth + 1)
                   for name in inputs)

    def poll(self) -> int:
        """Read the segments not seen yet; returns how many spans they held."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        from tracing.store import segment_files

        n = 0
        for path in segment_files(self.store):
            key = str(path)
            if key in self.seen:
                continue
            self.seen.add(key)
            if self._counted(path):  # a merge of segments already counted: its spans were observed then
                continue
            try:
                table = pq.read_table(path)
            except (OSError, pa.ArrowException):  # compacted away meanwhile, or unreadable: skipped
                continue
            self.metrics.observe(table)
            n += table.num_rows
        return n


def metrics(
    store: StoreOption = None,
    host: Annotated[str, typer.Option("--host", help="Address of /metrics. Loopback by default.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port of /metrics; 0 picks a free port.")] = 9464,
    tenants: Annotated[int, typer.Option(
        "--tenants", help="Tenant label for the first this many tenants (the rest: `other`); 0: no tenant label.")
                       ] = 0,
    from_start: Annotated[bool, typer.Option(
        "--from-start", help="Count the segments already in the store too (default: only those written from now).")
                          ] = False,
    poll: Annotated[float, typer.Option("--poll", help="Seconds between two looks for new segments.")] = 5.0,
    token_file: Annotated[Path | None, typer.Option(
        "--token-file", help="File holding a bearer token that scrapes must send.", show_default=False)] = None,
) -> None:
    """Serve /metrics (OpenMetrics, exemplars) from the spans new segments of a store hold (a store `collect` does
    not fill: the store exporter, `tailscope ingest`)."""
    from intake.collect.metrics import SpanMetrics

    with errors_as_messages():
        path = require_store(store_path(store))
    token = scrape_token(token_file, "--token-file", host)
    span_metrics = SpanMetrics(tenants)
    tail = StoreTail(path, span_metrics, from_start=from_start)
    tail.poll()
    try:
        server = serve_metrics([], host, port, token, renderers=[span_metrics.render])
    except OSError as exc:
        fail(f"could not listen: {exc}")
    sys.stderr.write(f"metrics http://{host}:{server.port}/metrics store={path}\n")
    sys.stderr.flush()
    try:
        while True:
            time.sleep(max(poll, 0.1))
            tail.poll()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("metrics")(metrics)
