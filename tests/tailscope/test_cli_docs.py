"""docs/cli.md documents every command and option: it must equal what the CLI renders."""

from __future__ import annotations

from pathlib import Path

from tailscope.cli import COMMANDS
from tailscope.cli_docs import render

DOC = Path(__file__).parents[2] / "docs" / "cli.md"


def test_cli_reference_is_current() -> None:
    assert DOC.read_text() == render(), "docs/cli.md is stale: run python -m tailscope.cli_docs > docs/cli.md"


def test_every_command_is_registered() -> None:
    text = render()
    for name in COMMANDS:
        assert f"## `tailscope {name}`" in text
