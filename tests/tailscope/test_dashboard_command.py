"""`tailscope dashboard`: the command line it runs, loopback default, errors as messages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from tailscope.cli import app
from tailscope.commands import dashboard as cmd


def test_app_file_is_the_router() -> None:
    assert cmd.app_file() == Path(__file__).parents[2] / "dashboard" / "app.py"


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
