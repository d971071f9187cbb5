"""Render docs/settings.md from every component's settings table, so the docs never drift from the code.

    python -m tailscope.settings_docs > docs/settings.md

It sits beside tailscope/cli_docs.py, on the CLI floor (it gathers the dashboard's table too).
"""

from __future__ import annotations

from analysis.settings import CLICKHOUSE, EXPLAIN
from dashboard.settings import DASHBOARD
from intake.collect.config import COLLECT
from intake.engines.settings import ENGINES
from tracing.settings import ROWS, SERVING, SettingsTable, render_markdown

#: Every settings table, in docs order.
TABLES: tuple[SettingsTable, ...] = (SERVING, ROWS, COLLECT, ENGINES, EXPLAIN, CLICKHOUSE, DASHBOARD)


def render() -> str:
    """The markdown of docs/settings.md."""
    return render_markdown(TABLES, "python -m tailscope.settings_docs > docs/settings.md")


if __name__ == "__main__":
    print(render(), end="")
