"""The Markdown tables an AppTest page drew (dashboard.formats.static_table), read back as rows of cell text.

A reader of its own for the tests (GitHub's table syntax: a header line, an alignment line, a line per row; cells
split at pipes no backslash escapes; backslash escapes undone), so a test compares what a reader sees with the
report's values, not the page's formatting with itself.
"""

from __future__ import annotations

import re
from typing import Any

_ALIGN = re.compile(r"\|(:?-{3,}:?\|)+")
_LINK = re.compile(r"\[(.*)\]\(([^()\s]*)\)")


def _cells(line: str) -> list[str]:
    inner = line.strip()
    assert inner.startswith("|") and inner.endswith("|"), line
    return [re.sub(r"\\(.)", r"\1", c.strip()) for c in re.split(r"(?<!\\)\|", inner[1:-1])]


def tables(at: Any) -> list[list[dict[str, str]]]:
    """Every Markdown table of the page, in order: its rows, each header -> the cell's text."""
    out = []
    for element in at.markdown:
        lines = str(element.value).splitlines()
        if len(lines) >= 2 and lines[0].startswith("|") and _ALIGN.fullmatch(lines[1].strip()):
            header = _cells(lines[0])
            out.append([dict(zip(header, _cells(row), strict=True)) for row in lines[2:]])
    return out


def link(cell: str) -> str | None:
    """The URL of a link cell (`[text](url)`), None for a cell without one."""
    found = _LINK.fullmatch(cell)
    return found.group(2) if found else None
