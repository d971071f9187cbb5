"""The exception tree of tailscope.

    TailscopeError                  base of every error tailscope raises on purpose
    ├── StoreError                  a store directory is missing, unreadable or not a store
    │   └── CompactorBusy           (intake.compact.merge) another process compacts this store already
    ├── InputError                  bad input: carries the source (file) and line it came from
    ├── QueryError                  a SQL query failed or was refused (carries the SQL)
    │   ├── RefusedQuery            (dashboard.data) the SQL console takes one SELECT only
    │   └── RefusedStatement        (analysis.engine.sandbox) a sandbox connection runs SELECT and EXPLAIN only
    ├── BadRequest                  a request that is wrong as sent: never retry it (also a ValueError)
    │   ├── MalformedField          (intake.otlp) an OTLP/JSON field of the wrong type or spelling: 400
    │   ├── TooLarge                (intake.collect.decode) a body over the size cap: 413
    │   └── BadEncoding             (intake.collect.decode) an unknown Content-Encoding: 415
    ├── RetryLater                  a receiver cannot take the request now: retry it (503 / UNAVAILABLE)
    │   ├── QueueFull               (intake.collect.commit) the write queue is at its span limit
    │   ├── Closed                  (intake.collect.commit) the receiver is shutting down
    │   └── Busy                    (intake.collect.intake) too many request bytes in flight
    ├── SettingError                (tracing.settings) a setting's value (argument or variable) cannot be used
    ├── MappingError                (analysis.mapping.rules) a `tailscope map` rule that cannot be used
    ├── ExpressionError             (analysis.mapping.expr) a rule expression that does not read (names its column)
    ├── DsnError                    (analysis.clickhouse.client) a ClickHouse DSN that cannot be read or reached
    ├── UnsupportedServer           (analysis.clickhouse.server) a ClickHouse release older than the oldest supported
    └── MissingExtra                a part of tailscope used without the pip extra that installs it

Each message says what was wrong, where, and what to do next, on one line. The leaves
marked with a module live there, beside the code that raises them.
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


class BadRequest(TailscopeError, ValueError):
    """A request that is wrong as sent and will be refused again if retried unchanged."""


class RetryLater(TailscopeError):
    """A receiver cannot take a request now (full, busy or stopping); the same request may succeed later."""


class MissingExtra(TailscopeError, ImportError):
    """A part of tailscope is used without the pip extra that installs what it needs (also an ImportError)."""

    def __init__(self, what: str, package: str, extra: str) -> None:
        self.package = package
        self.extra = extra
        super().__init__(f"{what} needs {package}, which is not installed: pip install 'tailscope[{extra}]'")
