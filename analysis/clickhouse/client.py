"""DSNs and clients: `chdb:PATH` (the embedded engine, chdb) or
`clickhouse://user[:password]@host[:port]/database` (a server over HTTP, through clickhouse-connect).

Both implement `Client`: a query returns an Arrow table. The network client is a thin factory over the same SQL.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol
from urllib.parse import parse_qsl, unquote, urlsplit

from analysis.clickhouse.server import features
from analysis.engine import model as M
from analysis.settings import CLICKHOUSE
from tracing.errors import MissingExtra, QueryError, TailscopeError

if TYPE_CHECKING:
    import pyarrow as pa


#: Default spans table: the clickhouseexporter's own name.
DEFAULT_TABLE: Final = "otel_traces"
#: Default HTTP port of a ClickHouse server.
DEFAULT_PORT: Final = 8123
#: Seconds a server may take to answer one request (a DSN's `?timeout=` changes it).
DEFAULT_TIMEOUT_S: Final = 300
#: Settings of every chdb session and every request to a server: no JIT compilation of expressions. tailscope's
#: queries run once each with long generated expressions (a report's cells query: 45 kB, 900 aggregates), so
#: compiling them costs more than it saves: 1.1 CPU-s of the 2.4 that query took (docs/benchmarks.md, "ClickHouse").
#: The answers are the same.
SESSION_SETTINGS: Final = {"compile_expressions": 0, "compile_aggregate_expressions": 0}
#: Settings of every session too where the server has them (`known_settings`; 24.8 lacks the first): no
#: `optimize_and_compare_chain` pass, which adds the comparisons a chain of them implies and, on the cells query's
#: 900 conditions, only hashes them: 0.15-0.2 of the 0.9 CPU-s each of the two largest takes at 1 M spans with 40
#: attributes. The answers are the same.
IF_KNOWN_SETTINGS: Final = {"optimize_and_compare_chain": 0}


def known_settings(query: Callable[[str], pa.Table]) -> dict[str, int]:
    """The IF_KNOWN_SETTINGS the server answering `query` (a SELECT's Arrow table) has."""
    names = ", ".join(f"'{k}'" for k in IF_KNOWN_SETTINGS)
    rows = query(f"SELECT name FROM system.settings WHERE name IN ({names})").to_pylist()
    return {str(r["name"]): IF_KNOWN_SETTINGS[str(r["name"])] for r in rows}


#: ClickHouse's name for a query refused for memory (Code 241).
MEMORY_REFUSED: Final = "MEMORY_LIMIT_EXCEEDED"


def memory_hint(what: str) -> str:
    """`what` (a failure's one line), with what to change when ClickHouse refused the query for memory."""
    if MEMORY_REFUSED not in what and "Code 241" not in what:
        return what
    setting = CLICKHOUSE.memory_temp_mib
    return (f"{what}; the request model's temporary tables are held in memory up to {setting.resolve()} MiB "
            f"({setting.env}): lower it to keep them on disk, or read a shorter time range")


def chdb_failure(exc: Exception) -> str:
    """One line for a statement chdb failed: its first line, or for a refusal for memory ClickHouse's message
    without the parts and marks it was reading, and what to change (`memory_hint`)."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    if MEMORY_REFUSED not in line:
        return line
    said = re.search(r"DB::Exception: (.*?)(?:: \(|$)", line)
    return memory_hint(f"ClickHouse refused a query for memory: {said.group(1) if said else line} "
                       f"({MEMORY_REFUSED})")


class DsnError(TailscopeError):
    """A ClickHouse DSN that cannot be read."""


@dataclass(frozen=True)
class Dsn:
    """Where a ClickHouse engine is: an embedded chdb path, or a server over HTTP."""

    kind: str  # "chdb" or "http"
    path: str = ""
    host: str = ""
    port: int = DEFAULT_PORT
    user: str = "default"
    password: str = ""
    database: str = "default"
    timeout_s: int = DEFAULT_TIMEOUT_S

    def __str__(self) -> str:
        if self.kind == "chdb":
            return f"chdb:{self.path}"
        return f"clickhouse://{self.user}@{self.host}:{self.port}/{self.database}"  # never the password


def parse_dsn(text: str) -> Dsn:
    """Read `chdb:PATH` or `clickhouse://user[:password]@host[:port][/database][?timeout=SECONDS]`; DsnError names
    what is wrong."""
    if text.startswith("chdb:"):
        path = text[len("chdb:"):]
        if not path:
            raise DsnError(f"DSN {text!r} names no directory: write chdb:PATH")
        return Dsn("chdb", path=path)
    if not text.startswith("clickhouse://"):
        raise DsnError(f"cannot read DSN {text!r}: write chdb:PATH or clickhouse://user@host:8123/db")
    try:
        parts = urlsplit(text)
        port = parts.port or DEFAULT_PORT
    except ValueError as exc:
        raise DsnError(f"cannot read DSN {text!r}: {exc}") from None
    if not parts.hostname:
        raise DsnError(f"DSN {text!r} names no host: write clickhouse://user@host:8123/db")
    database = parts.path.strip("/") or "default"
    if not re.fullmatch(r"[A-Za-z0-9_]+", database):
        raise DsnError(f"DSN {text!r}: database name {database!r} is not a plain identifier")
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = set(options) - {"timeout"}
    if unknown:
        raise DsnError(f"DSN {text!r}: unknown option {sorted(unknown)[0]!r} (the one option is ?timeout=SECONDS)")
    timeout = options.get("timeout", str(DEFAULT_TIMEOUT_S))
    if not timeout.isdigit() or int(timeout) == 0:
        raise DsnError(f"DSN {text!r}: timeout {timeout!r} is not a whole number of seconds above 0")
    return Dsn("http", host=parts.hostname, port=port, user=unquote(parts.username or "default"),
               password=unquote(parts.password or ""), database=database, timeout_s=int(timeout))


class Client(Protocol):
    """The little tailscope asks of a ClickHouse engine."""

    dsn: Dsn

    def query(self, sql: str, settings: dict[str, Any] | None = None) -> pa.Table:
        """Run a SELECT; the result as an Arrow table."""
        ...

    def command(self, sql: str) -> None:
        """Run a statement that returns nothing (DDL, INSERT ... SELECT)."""
        ...

    def insert_arrow(self, table: str, data: pa.Table) -> None:
        """Append an Arrow table whose column names match the table's."""
        ...

    def close(self) -> None:
        """Release the engine."""
        ...


def settings_clause(settings: dict[str, Any] | None) -> str:
    """A SETTINGS clause (with its leading space) for `settings`; '' when there are none."""
    if not settings:
        return ""
    return " SETTINGS " + ", ".join(f"{k} = {v!r}" if isinstance(v, str) else f"{k} = {int(v)}"
                                    for k, v in settings.items())


class ChdbClient:
    """The embedded engine (chdb) on a directory: one session per client."""

    def __init__(self, dsn: Dsn) -> None:
        try:
            from chdb import session
        except ModuleNotFoundError as exc:
            raise MissingExtra("the embedded ClickHouse engine", exc.name or "chdb", "clickhouse") from None
        self.dsn = dsn
        Path(dsn.path).mkdir(parents=True, exist_ok=True)
        self._s = session.Session(str(Path(dsn.path).resolve()))
        for key, value in SESSION_SETTINGS.items():
            self._s.query(f"SET {key} = {int(value)}", "CSV")
        for key, value in known_settings(self.query).items():
            self._s.query(f"SET {key} = {int(value)}", "CSV")

    def query(self, sql: str, settings: dict[str, Any] | None = None) -> pa.Table:
        """Run a SELECT; the settings ride on the query's SETTINGS clause, on a line of its own (a trailing `--` or
        `#` comment in `sql` would otherwise swallow it, and readonly = 1 with it)."""
        try:
            out = self._s.query(sql.rstrip().rstrip(";") + "\n" + settings_clause(settings), "ArrowTable")
        except Exception as exc:
            raise QueryError(sql, chdb_failure(exc)) from None
        return out  # type: ignore[no-any-return]

    def command(self, sql: str) -> None:
        """Run a statement."""
        try:
            self._s.query(sql, "CSV")
        except Exception as exc:
            raise QueryError(sql, chdb_failure(exc)) from None

    def insert_arrow(self, table: str, data: pa.Table) -> None:
        """Append through a Parquet file: chdb reads local files directly."""
        import tempfile

        import pyarrow.parquet as pq

        with tempfile.TemporaryDirectory(prefix="tailscope-chdb-") as tmp:
            path = Path(tmp) / "batch.parquet"
            pq.write_table(data, path)
            cols = ", ".join(f"`{c}`" for c in data.column_names)
            self.command(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM file({M.quote(str(path))}, Parquet)")

    def close(self) -> None:
        """Close the session."""
        self._s.close()


class HttpClient:
    """A ClickHouse server over HTTP, through clickhouse-connect (thin: the same SQL as the embedded engine).

    Every failure is one line saying which: nothing answers at the address ("cannot reach"), the
    server refused the user, the database does not exist, no answer within the DSN's timeout,
    the connection closed mid-answer, or the server's own error (its code and message).
    """

    def __init__(self, dsn: Dsn) -> None:
        try:
            import clickhouse_connect
        except ModuleNotFoundError as exc:
            raise MissingExtra("a ClickHouse server", exc.name or "clickhouse-connect", "clickhouse") from None
        import logging

        self.dsn = dsn
        log = logging.getLogger("clickhouse_connect")
        level = log.level
        log.setLevel(logging.CRITICAL)  # the driver logs the failure too; ours is the one line that says it
        try:
            self._c = clickhouse_connect.get_client(host=dsn.host, port=dsn.port, username=dsn.user,
                                                    password=dsn.password, database=dsn.database,
                                                    send_receive_timeout=dsn.timeout_s,
                                                    settings=dict(SESSION_SETTINGS))
            for key, value in known_settings(self._c.query_arrow).items():
                self._c.set_client_setting(key, value)
        except Exception as exc:
            raise DsnError(http_failure(dsn, exc)) from None
        finally:
            log.setLevel(level)

    def _fail(self, sql: str, exc: Exception) -> QueryError:
        return QueryError(sql, memory_hint(http_failure(self.dsn, exc)))

    def query(self, sql: str, settings: dict[str, Any] | None = None) -> pa.Table:
        """Run a SELECT; the result as Arrow."""
        try:
            return self._c.query_arrow(sql, settings=settings or {}, use_strings=True)
        except Exception as exc:
            raise self._fail(sql, exc) from None

    def command(self, sql: str) -> None:
        """Run a statement."""
        try:
            self._c.command(sql)
        except Exception as exc:
            raise self._fail(sql, exc) from None

    def insert_arrow(self, table: str, data: pa.Table) -> None:
        """Append an Arrow table."""
        try:
            self._c.insert_arrow(table, data)
        except Exception as exc:
            raise self._fail(f"INSERT INTO {table}", exc) from None

    def close(self) -> None:
        """Close the HTTP pool."""
        self._c.close()


def _causes(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and len(out) < 16:
        out.append(seen)
        seen = seen.__cause__ or seen.__context__
    return out


def http_failure(dsn: Dsn, exc: Exception) -> str:
    """One line for a failed request to the server at `dsn`: which of the failures it is (see HttpClient)."""
    code = getattr(exc, "code", None)
    text = " ".join(str(e) for e in _causes(exc))
    names = {type(e).__name__ for e in _causes(exc)}
    said = re.search(r"DB::Exception: (.*?)(?: \(([A-Z_]+)\))?(?: \(version [^)]*\))?(?:\s*\(for url|$|\n)", text)
    message = said.group(1).strip().rstrip(".") if said else ""
    if code is None and (m := re.search(r"code: (\d+)", text)):
        code = int(m.group(1))
    if code in (516, 192, 193, 194):
        message = message.removeprefix(f"{dsn.user}: ")  # the server names the user first
        return f"ClickHouse at {dsn} refused user {dsn.user!r}: {message or 'authentication failed'} (Code {code})"
    if code == 81:
        return f"ClickHouse at {dsn}: {message or 'the database does not exist'} (Code 81)"
    if code is not None:
        return f"ClickHouse at {dsn} failed the query: {message or text.splitlines()[0]} (Code {code})"
    if names & {"ReadTimeoutError", "TimeoutError", "ReadTimeout"} or "timed out" in text.lower():
        return f"ClickHouse at {dsn} did not answer within {dsn.timeout_s} s (the DSN's ?timeout=)"
    if names & {"NewConnectionError", "ConnectionRefusedError", "NameResolutionError", "ConnectTimeoutError"} or (
            "refused" in text.lower() or "resolve" in text.lower() or "max retries" in text.lower()):
        return f"cannot reach ClickHouse at {dsn}: {text.splitlines()[0]}"
    if names & {"ProtocolError", "IncompleteRead", "RemoteDisconnected", "StreamFailureError",
                "ConnectionResetError"} or "connection broken" in text.lower():
        return f"ClickHouse at {dsn} closed the connection mid-answer: {text.splitlines()[0]}"
    return f"ClickHouse at {dsn}: {text.splitlines()[0] if text else type(exc).__name__}"


def open_client(dsn: str | Dsn) -> Client:
    """A client for a DSN (see `parse_dsn`), after checking the server's release (UnsupportedServer when too old)."""
    d = parse_dsn(dsn) if isinstance(dsn, str) else dsn
    client: Client = ChdbClient(d) if d.kind == "chdb" else HttpClient(d)
    try:
        features(client, fresh=True)
    except BaseException:
        client.close()
        raise
    return client


def literal(value: str | int) -> str:
    """A ClickHouse literal: integers as they are, strings quoted with `\\` and `'` escaped."""
    if isinstance(value, int):
        return str(int(value))
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def check_table_name(table: str) -> str:
    """A table name as given (`db.table` allowed); QueryError unless it is plain identifiers."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?", table):
        raise QueryError("", f"table name {table!r} is not a plain identifier (db.table allowed)")
    return table

