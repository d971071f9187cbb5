"""`tailscope dashboard`: the command line it runs, loopback default, errors as messages."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from tailscope.cli import app
from tailscope.commands import dashboard as cmd
from tests import servers
from tracing.store import init_store


def test_app_file_is_the_server_that_runs_the_router() -> None:
    assert cmd.app_file() == Path(__file__).parents[2] / "dashboard" / "server.py"
    from dashboard import server

    assert server.app.script_path == Path(__file__).parents[2] / "dashboard" / "app.py"


def test_the_server_warms_every_dashboard_module_the_router_and_pages_import() -> None:
    import ast

    from dashboard import server

    root = Path(__file__).parents[2] / "dashboard"
    imported = set()
    for file in [root / "app.py", *sorted((root / "app_pages").glob("*.py"))]:
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "dashboard":
                imported |= {f"dashboard.{a.name}" for a in node.names}
    assert imported and imported <= set(server.WARM_MODULES)


def test_the_servers_start_up_waits_for_its_warm_up_at_most_its_bound() -> None:
    """In a fresh interpreter whose import of dashboard.data is held until the server has started: the lifespan
    yields (the server starts) after READY_WAIT_S with the import still held, and once released every warmed module
    is imported."""
    code = ("import asyncio, sys, threading, time\n"
            "gate = threading.Event()\n"
            "class Hold:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'dashboard.data':\n"
            "            print('held' if gate.wait(30) else 'not released', flush=True)\n"
            "        return None\n"
            "sys.meta_path.insert(0, Hold())\n"
            "from dashboard import server\n"
            "server.READY_WAIT_S = 0.5\n"
            "async def main():\n"
            "    t0 = time.monotonic()\n"
            "    async with server._lifespan(server.app):\n"
            "        print('started', time.monotonic() - t0 >= 0.5, flush=True)\n"
            "        gate.set()\n"
            "asyncio.run(main())\n"
            "[t.join(60) for t in threading.enumerate() if t.name == 'tailscope-warm-imports']\n"
            "print(all(m in sys.modules for m in server.WARM_MODULES))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["started", "True", "held", "True"]


def test_the_server_turns_nagle_off_for_the_connections_its_listener_accepts() -> None:
    """A listening socket bound as Streamlit binds it (no protocol named, so asyncio leaves Nagle on): after
    nodelay_listeners, a connection it accepts has TCP_NODELAY set, and a connected socket is left as it was."""
    from dashboard import server

    def nodelay(sock: socket.socket) -> int:
        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)

    with socket.socket(family=socket.AF_INET) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        with socket.create_connection(listener.getsockname()) as before, listener.accept()[0] as accepted_before:
            assert (listener.proto, nodelay(listener), nodelay(accepted_before), nodelay(before)) == (0, 0, 0, 0)
            assert server.nodelay_listeners() >= 1
            with socket.create_connection(listener.getsockname()) as client, listener.accept()[0] as accepted:
                assert (nodelay(listener), nodelay(accepted), nodelay(accepted_before), nodelay(client)) == (1, 1, 0, 0)
        assert listener.fileno() >= 0  # its duplicate was closed, not the socket itself


def test_the_servers_start_up_opens_the_store_it_serves(tmp_path: Path) -> None:
    """In a fresh interpreter serving `--store DIR`: the warm-up thread opens that store's workbench once, the server
    starts once the store's own warm-up is over, and a session's later open finds it in the cache (no second open)."""
    store = str(init_store(tmp_path / "store"))
    code = ("import asyncio, sys, threading, time\n"
            f"sys.argv = ['server.py', '--store', {store!r}]\n"
            "from dashboard import data, server\n"
            "opened = []\n"
            "real = data.Workbench.__init__\n"
            "def counted(self, *a, **k):\n"
            "    opened.append(threading.current_thread().name)\n"
            "    real(self, *a, **k)\n"
            "data.Workbench.__init__ = counted\n"
            "slow = data.prewarm\n"
            "data.prewarm = lambda db: (time.sleep(1), slow(db))  # a warm-up that takes a while\n"
            "async def main():\n"
            "    async with server._lifespan(server.app):\n"
            f"        print(data.workbench({store!r}).warmed.is_set())\n"
            "asyncio.run(main())\n"
            "[t.join(60) for t in threading.enumerate() if t.name == 'tailscope-warm-imports']\n"
            "print(opened)\n"
            f"print(data.workbench({store!r}) is data.workbench({store!r}), opened)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.splitlines() == ["True", "['tailscope-warm-imports']", "True ['tailscope-warm-imports']"]


def test_a_first_session_opens_the_store_while_the_dashboard_imports(tmp_path: Path) -> None:
    """In a fresh interpreter, the first session's script (app.py, as a server just started runs it) imports
    dashboard.data: the module starts opening the configured store in its own thread before it imports the analysis
    stack (held here until the store's connection is opened: it would wait for ever if the open needed it), the
    session's open waits for that one (no second open), and the warm-up runs once the module is imported."""
    store = str(init_store(tmp_path / "store"))
    app_file = str(Path(__file__).parents[2] / "dashboard" / "app.py")
    code = ("import os, sys, threading\n"
            f"os.environ['TAILSCOPE_STORE'] = {store!r}\n"
            "from streamlit.testing.v1 import AppTest\n"
            "import analysis.engine.connect as CN\n"
            "opened, held, gate = [], [], threading.Event()\n"
            "class Hold:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'analysis.report':\n"
            "            held.append(gate.wait(20))\n"
            "        return None\n"
            "sys.meta_path.insert(0, Hold())\n"
            "real = CN.connect\n"
            "def counted(*a, **k):\n"
            "    opened.append(threading.current_thread().name)\n"
            "    gate.set()\n"
            "    return real(*a, **k)\n"
            "CN.connect = counted\n"
            "print('dashboard.data' in sys.modules, 'analysis.report' in sys.modules)\n"
            f"at = AppTest.from_file({app_file!r}, default_timeout=60).run()\n"
            "from dashboard import data\n"
            f"wb = data.workbench({store!r})\n"
            "print(not at.exception, held, wb.warmed.wait(30), opened)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.splitlines() == ["False False", "True [True] True ['tailscope-open']"]


def test_finding_the_app_does_not_import_the_dashboard_package() -> None:
    out = subprocess.run([sys.executable, "-c", "import sys, tailscope.commands.dashboard as d; d.app_file(); "
                          "print('dashboard' in sys.modules, 'streamlit' in sys.modules)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_streamlit_command_is_headless_on_the_given_address(tmp_path: Path) -> None:
    argv = cmd.streamlit_command(Path("/x/app.py"), ["--store", str(tmp_path)], "127.0.0.1", 8600)
    assert argv[:5] == [sys.executable, "-m", "streamlit", "run", "/x/app.py"]
    opts = dict(zip(argv[5:-3:2], argv[6:-3:2], strict=True))
    assert opts["--server.address"] == "127.0.0.1"
    assert opts["--server.port"] == "8600"
    assert opts["--server.headless"] == "true"
    assert opts["--browser.gatherUsageStats"] == "false"
    assert opts["--runner.magicEnabled"] == "false"
    assert argv[-3:] == ["--", "--store", str(tmp_path)]


def test_defaults_are_loopback_and_8501() -> None:
    import inspect

    params = inspect.signature(cmd.dashboard).parameters
    assert params["host"].default == "127.0.0.1"
    assert params["port"].default == 8501


def test_a_missing_store_is_a_one_line_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["dashboard", "--store", str(tmp_path / "nope")])
    assert result.exit_code == 1
    assert "no store there" in result.output


def _children(pid: int) -> list[int]:
    """The pids of a process's children (Linux's /proc)."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def _gone(pid: int) -> bool:
    """No such process, or a zombie (dead, waiting for its parent to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def _gone_soon(pid: int) -> bool:
    """`_gone` within 10 s (bounded polling)."""
    for _ in range(100):
        if _gone(pid):
            return True
        time.sleep(0.1)
    return _gone(pid)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_killed_dashboard_command_takes_its_streamlit_server_with_it(tmp_path: Path) -> None:
    """SIGKILL to `tailscope dashboard` (no chance to stop its child): the Streamlit server still stops."""
    store = init_store(tmp_path / "store")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = Path(sys.executable).parent / "tailscope"
    proc = servers.spawn([str(exe), "dashboard", "--store", str(store), "--host", "127.0.0.1", "--port", str(port)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        child = None
        for _ in range(300):  # bounded: about 30 s for Streamlit to answer
            kids = _children(proc.pid)
            try:
                if kids and httpx.get(f"http://127.0.0.1:{port}/_stcore/health", timeout=1).status_code == 200:
                    child = kids[0]
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        assert child is not None, "the dashboard did not come up"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert _gone_soon(child), "Streamlit outlived its killed `tailscope dashboard`"
    finally:
        servers.stop(proc)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_servers_started_by_tests_die_with_the_test_process(how: int) -> None:
    """tests.servers.spawn: a test process killed (SIGKILL: no finalizer runs) or terminated (SIGTERM) leaves no
    server behind."""
    code = ("import sys, time; from tests import servers; "
            "p = servers.spawn([sys.executable, '-c', 'import time; time.sleep(120)']); "
            "print(p.pid, flush=True); time.sleep(120)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).parents[2])
    try:
        assert parent.stdout is not None
        server = int(parent.stdout.readline())
        assert not _gone(server)
        parent.send_signal(how)
        parent.wait(timeout=10)
        assert _gone_soon(server), "the server outlived the test process"
    finally:
        parent.kill()
        parent.wait()
