"""The exception tree of tailscope.

    TailscopeError                  base of every error tailscope raises on purpose
    ├── StoreError                  a store directory is missing, unreadable or not a store
    ├── InputError                  bad input: carries the source (file) and line it came from
    ├── QueryError                  a SQL query failed or was refused (carries the SQL)
    └── MissingExtra                a part of tailscope used without the pip extra that installs it

Each message says what was wrong, where, and what to do next, on one line.
"""

from __future__ import annotations


class TailscopeError(Exception):
    """Base of every error tailscope raises on purpose."""


class StoreError(TailscopeError):
    """A store directory is missing, unreadable or not a tailscope store."""


class InputError(TailscopeError):
    """Bad trace input; `source` and `line` say where (line is 1-based, 0 when unknown)."""

    def __init__(self, source: str, line: int, what: str) -> None:
        self.source = source
        self.line = line
        self.what = what
        where = f"{source}:{line}" if line else source
        super().__init__(f"{where}: {what}")


class QueryError(TailscopeError):
    """A SQL query failed or was refused; `sql` is the query."""

    def __init__(self, sql: str, what: str) -> None:
        self.sql = sql
        self.what = what
        super().__init__(what)


class MissingExtra(TailscopeError, ImportError):
    """A part of tailscope is used without the pip extra that installs what it needs (also an ImportError)."""

    def __init__(self, what: str, package: str, extra: str) -> None:
        self.package = package
        self.extra = extra
        super().__init__(f"{what} needs {package}, which is not installed: pip install 'tailscope[{extra}]'")
