"""docs/settings.md is generated from the settings tables; every setting is documented and read by code."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import typer.core
import typer.main

from intake.collect.config import COLLECT, MIB
from tailscope.cli import app
from tailscope.commands.collect import setting_values
from tailscope.settings_docs import TABLES, render
from tracing.settings import Setting, SettingsTable

ROOT = Path(__file__).parents[2]
DOC = ROOT / "docs" / "settings.md"
SOURCES = ("tracing", "analysis", "dashboard", "sample_traces", "benchmarks")


def _attributes(module: str) -> set[str]:
    """Every attribute name read in `module`'s source (`x.name`)."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, f"reader module {module} does not exist"
    tree = ast.parse(Path(spec.origin).read_text())
    return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}


def unused(table: SettingsTable) -> list[str]:
    """Settings of `table` that none of its reader modules reads (as `something.<setting name>`)."""
    read: set[str] = set()
    for module in table.readers:
        read |= _attributes(module)
    return [s.name for s in table.settings() if s.name not in read]


def test_settings_doc_is_current() -> None:
    assert DOC.read_text() == render(), "docs/settings.md is stale: run python -m tailscope.settings_docs > " \
                                        "docs/settings.md"


def test_every_setting_has_a_row_in_its_section() -> None:
    text = DOC.read_text()
    for table in TABLES:
        match = re.search(rf"^## {re.escape(table.title)}\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
        assert match, f"docs/settings.md has no section {table.title!r}"
        rows = re.findall(r"^\| `([a-z0-9_]+)` \|", match.group(1), flags=re.M)
        assert rows == [s.name for s in table.settings()], table.title
        for s in table.settings():
            assert s.help.strip(), f"{s.name} has no help"


def test_every_setting_is_read_by_its_component() -> None:
    for table in TABLES:
        assert table.readers, f"{type(table).__name__} names no reader module"
        assert unused(table) == [], f"settings of {type(table).__name__} never read by {table.readers}"


def test_an_unread_setting_is_caught() -> None:
    class Stray(SettingsTable):
        readers = ("tracing.configure",)
        max_queue_size: Setting[int] = Setting(int, 1, "read by configure")
        never_read_anywhere: Setting[int] = Setting(int, 1, "read by nobody")

    assert unused(Stray()) == ["never_read_anywhere"]


def test_environment_variables_are_unique_and_all_in_a_table() -> None:
    owned = [s.env for table in TABLES for s in table.settings() if s.env]
    assert len(owned) == len(set(owned))
    pattern = re.compile(r"\bTAILSCOPE_[A-Z0-9_]+\b")
    found: dict[str, Path] = {}
    for package in SOURCES:
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    for name in pattern.findall(node.value):
                        found.setdefault(name, path)
    strays = {name: str(path.relative_to(ROOT)) for name, path in found.items() if name not in owned}
    assert strays == {}, "a TAILSCOPE_ variable outside every settings table"


def test_collect_options_are_generated_from_the_table() -> None:
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    command = group.commands["collect"]
    options = {p.name: p for p in command.params}
    with_option = [s for s in COLLECT.settings() if s.option]
    assert [s.name for s in with_option] == [n for n in options if n in COLLECT.defaults()]
    for s in with_option:
        param = options[s.name]
        assert isinstance(param, typer.core.TyperOption)  # an option, with its help
        assert "/".join([*param.opts, *param.secondary_opts]) == s.option  # "--flag/--no-flag" for a switch
        assert param.default == (s.default // s.option_scale if s.option_scale != 1 else s.default)
        assert param.help == s.help + (f" In {s.option_unit}." if s.option_unit else "")
    assert {"store", "token_file", "quiet"} <= set(options)
    assert setting_values(COLLECT, {"max_body_bytes": 3, "dedupe_window": 5}) == {"max_body_bytes": 3 * MIB,
                                                                                "dedupe_window": 5}
