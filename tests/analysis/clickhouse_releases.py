"""The ClickHouse releases the tests run on, each served over HTTP by tests/clickhouse_http.py.

The newest release is the chdb of the project's venv; each older one is the chdb of
`.venv-ch/<release>` (built by `make test`, see the Makefile's CH_RELEASES). `serve` starts
the HTTP front on 127.0.0.1 (port 0) under that venv's Python and yields its `clickhouse://`
DSN, which our real network client (clickhouse-connect) drives.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.needs import need

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "tests" / "clickhouse_http.py"
#: The name of the newest release (the project venv's chdb) among the releases.
NEWEST = "newest"


def older_releases() -> list[str]:
    """The older releases `make test` installs (the Makefile's CH_RELEASES), oldest first."""
    m = re.search(r"^CH_RELEASES := (.+)$", (ROOT / "Makefile").read_text(), re.M)
    assert m is not None, "the Makefile names CH_RELEASES"
    return m.group(1).split()


def python_of(release: str) -> str:
    """The Python whose chdb embeds `release` (skipped off CI, failed under it, when not installed)."""
    if release == NEWEST:
        return sys.executable
    py = ROOT / ".venv-ch" / release / "bin" / "python"
    need(py.exists(), f"chdb embedding ClickHouse {release} ({py.relative_to(ROOT)})",
         "run `make ch-releases`")
    return str(py)


@dataclass(frozen=True)
class Served:
    """A running HTTP front: its DSN (database `tailscope`), port and the server's version()."""

    dsn: str
    port: int
    version: str
    user: str
    password: str


@contextmanager
def serve(release: str, path: Path, *, user: str = "default", password: str = "") -> Iterator[Served]:
    """Serve chdb of `release` on `path` over ClickHouse's HTTP interface until the block ends (then kill it)."""
    proc = subprocess.Popen([python_of(release), str(SERVER), "--path", str(path), "--database", "tailscope",
                             "--user", user, "--password", password],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line, f"the HTTP front under {release} did not start (exit {proc.poll()})"
        port, version = int(line[0]), line[1]
        auth = f"{user}:{password}" if password else user
        yield Served(f"clickhouse://{auth}@127.0.0.1:{port}/tailscope", port, version, user, password)
    finally:
        proc.kill()
        proc.wait(timeout=30)
