"""The command line lists every command; a broken command module is an error, a missing extra one clear line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tailscope import cli

ROOT = Path(__file__).resolve().parents[2]


def run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_every_command_module_is_registered() -> None:
    modules = {p.stem for p in (ROOT / "tailscope" / "commands").glob("*.py")} - {"__init__", "common", "engine"}
    assert set(cli.COMMANDS) == modules
    import typer.core
    import typer.main

    group = typer.main.get_command(cli.app)
    assert isinstance(group, typer.core.TyperGroup) and list(group.commands) == list(cli.COMMANDS)


def test_a_broken_command_module_fails_loudly() -> None:
    done = run("import sys; sys.modules['tailscope.commands.sql'] = None; import tailscope.cli")
    assert done.returncode == 1
    assert "ModuleNotFoundError" in done.stderr and "tailscope.commands.sql" in done.stderr


def test_a_missing_extra_is_one_line_naming_it() -> None:
    code = ("import sys; sys.modules['grpc'] = None; sys.argv = ['tailscope', *sys.argv[1:]]; "
            "from tailscope.cli import main; main()")
    done = run(code, "collect", "--store", "/nonexistent")
    assert done.returncode == 1
    assert done.stderr.strip() == ("tailscope collect needs grpc, which is not installed: "
                                   "pip install 'tailscope[collect]'")
    listed = run(code, "--help")
    assert listed.returncode == 0
    assert "collect" in listed.stdout and "report" in listed.stdout


def test_python_dash_m_tailscope_is_the_cli() -> None:
    done = subprocess.run([sys.executable, "-m", "tailscope", "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0
    for name in cli.COMMANDS:
        assert name in done.stdout


def test_help_loads_no_heavy_package() -> None:
    """Start-up stays fast: listing the commands and a command's help import no analysis, DuckDB, polars, ...

    One interpreter runs every help in turn and lists the heavy modules loaded after each: a module, once
    imported, stays in sys.modules, so a heavy one shows from the first help that imported it on."""
    helps = [["--help"], *([name, "--help"] for name in cli.COMMANDS)]
    code = ("import json, sys\n"
            "from tailscope.cli import main\n"
            "heavy = ('duckdb', 'polars', 'pyarrow', 'numpy', 'grpc', 'streamlit', 'analysis', 'intake.otlp')\n"
            "for args in json.loads(sys.argv[1]):\n"
            "    sys.argv = ['tailscope', *args]\n"
            "    try:\n        main()\n    except SystemExit:\n        pass\n"
            "    names = {m if m == 'intake.otlp' else m.split('.')[0] for m in sys.modules\n"
            "             if m.split('.')[0] in heavy or m == 'intake.otlp'}\n"
            "    print(json.dumps([args, sorted(names)]), file=sys.stderr)")
    done = run(code, json.dumps(helps))
    assert done.returncode == 0, done.stderr
    loaded = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("[[")]
    assert loaded == [[args, []] for args in helps], done.stderr


def test_a_missing_package_named_in_needs_is_one_line() -> None:
    code = ("import sys; sys.modules['polars'] = None; sys.argv = ['tailscope', *sys.argv[1:]]; "
            "from tailscope.cli import main; main()")
    done = run(code, "report", "--store", "/nonexistent")
    assert done.returncode == 1
    assert done.stderr.strip() == ("tailscope report needs polars, which is not installed: "
                                   "pip install 'tailscope[analysis]'")


def test_the_entry_point_freezes_what_the_command_left_for_the_teardown() -> None:
    """main() ends with every object moved out of the collector's reach, so the interpreter's teardown does not
    scan them all again; the exit code is the command's."""
    code = ("import gc, sys; sys.argv = ['tailscope', *sys.argv[1:]]\n"
            "from tailscope.cli import main\n"
            "try:\n    main()\nexcept SystemExit as exc:\n"
            "    print(exc.code, len(gc.get_objects()), file=sys.stderr)")
    for args, exit_code in ((["--help"], 0), (["report", "--store", "/nonexistent-store"], 1)):
        done = run(code, *args)
        got, unfrozen = done.stderr.strip().splitlines()[-1].split()
        assert int(got) == exit_code and int(unfrozen) < 50, (args, done.stderr)
