"""Debian's Prometheus and Alertmanager as child processes on loopback, for the /metrics and alert-routing tests.

`make test` installs both (`make monitoring-deps`); without them a test skips on a developer's
machine and fails under CI (tests/needs.py). Each server gets a free port, its own data
directory under the test's tmp_path, and is killed when the context ends.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.needs import need

PROMETHEUS = "prometheus"
ALERTMANAGER = "prometheus-alertmanager"


def need_monitoring() -> None:
    """Skip (or fail under CI) unless Debian's prometheus and prometheus-alertmanager are installed."""
    need(shutil.which(PROMETHEUS) is not None and shutil.which(ALERTMANAGER) is not None,
         "prometheus and prometheus-alertmanager", "run `make monitoring-deps` (apt-get install prometheus "
         "prometheus-alertmanager)")


def free_port() -> int:
    """A port free on 127.0.0.1 now (the server binds it right after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(url: str, timeout: float = 5.0) -> Any:
    """GET a URL and decode its JSON."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def wait_for(cond: Any, seconds: float, what: str, extra: Any = lambda: "") -> Any:
    """Poll `cond` every 0.25 s until it returns something truthy (returned), or fail after `seconds`."""
    deadline = time.monotonic() + seconds
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = cond()
            if value:
                return value
        except OSError as exc:  # not up yet
            last_error = exc
        time.sleep(0.25)
    raise AssertionError(f"timed out after {seconds} s waiting for {what}; last error {last_error!r}; {extra()}")


@contextmanager
def _child(args: list[str], log: Path, ready_url: str, what: str) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(args, stdout=open(log, "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited: {log.read_text()[-2000:]}")
        return bool(urllib.request.urlopen(ready_url, timeout=2).status == 200)

    try:
        wait_for(ready, 60, f"{what} to be ready", lambda: log.read_text()[-2000:])
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


@contextmanager
def prometheus(tmp: Path, target: str, scrape_s: float = 1.0) -> Iterator[str]:
    """Prometheus scraping `target` (host:port, /metrics) every `scrape_s`, exemplar storage on; yields its URL."""
    need_monitoring()
    port = free_port()
    (tmp / "prometheus.yml").write_text(
        f"global:\n  scrape_interval: {round(scrape_s * 1000)}ms\n  scrape_timeout: {round(scrape_s * 1000)}ms\n"
        f"scrape_configs:\n  - job_name: tailscope\n    static_configs:\n      - targets: ['{target}']\n")
    url = f"http://127.0.0.1:{port}"
    with _child([PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--enable-feature=exemplar-storage"],
                tmp / "prometheus.log", f"{url}/-/ready", "prometheus"):
        yield url


@contextmanager
def alertmanager(tmp: Path, config: str) -> Iterator[str]:
    """Alertmanager with `config` (YAML), clustering off; yields its URL."""
    need_monitoring()
    port = free_port()
    (tmp / "alertmanager.yml").write_text(config)
    url = f"http://127.0.0.1:{port}"
    with _child([ALERTMANAGER, f"--config.file={tmp / 'alertmanager.yml'}", f"--storage.path={tmp / 'am-data'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                tmp / "alertmanager.log", f"{url}/-/ready", "alertmanager"):
        yield url


def prom_query(url: str, path: str, **params: str) -> Any:
    """The `data` of a Prometheus HTTP API answer (`path` e.g. /api/v1/query)."""
    answer = get_json(f"{url}{path}?{urllib.parse.urlencode(params)}")
    assert answer["status"] == "success", answer
    return answer["data"]
