"""A ClickHouse client for tests that runs no statement twice on the same data: `Memo(client)`.

The dashboard's data functions send the same SQL on the same data many times (each report and each
explained window runs the attribute pass again; each cost call builds the same `_cost_*` tables): about
half of what a comparison of every data function costs the engine. A test comparing those functions on
two engines keeps every call and every comparison, and this client answers a repeated statement from
the same engine's first answer instead of running it again:

- a read (SELECT / WITH) is answered from memory when the same text, with the same settings, was
  answered before on the same data: the same version of every session table its text names;
- a session table made by `CREATE TEMPORARY TABLE t ENGINE = E AS <read>` gets a version: a digest of
  that text and the versions of the tables it names, so the same text on the same tables makes the same
  version; `DROP TEMPORARY TABLE IF EXISTS t` of such a table is held back (and is nothing to do when `t` is
  gone already), and when a later statement makes `t` again with the same version the table is kept
  instead (the drop is sent first otherwise, and before any statement that names `t`);
- anything else (INSERT, SET, other DDL, a failed statement, an Arrow insert) may change any table: the
  held-back drops are sent first, then it runs, and no earlier answer or version is used again. A read
  of `system.` tables, of files or of anything that differs from run to run (now(), rand(), ...) always runs.

A table's name standing in a statement's text is what "reads the table" means here: a column or alias
of the same name only makes the key stricter. Tables the client did not make are taken as unchanged
until one of the statements above ran: nothing else may write them meanwhile (one bench, data loaded
before). What it gives up: a repeated statement is not run again on the engine, so an engine answering
the same statement differently the second time would not be seen (the first answer is what every
comparison checks).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import pyarrow as pa

_CTAS = re.compile(r"(?is)^\s*CREATE\s+TEMPORARY\s+TABLE\s+(?P<name>[A-Za-z_]\w*)\s+ENGINE\s*=\s*\w+(?:\(\s*\))?\s+"
                   r"AS\s+(?P<read>(?:SELECT|WITH)\b.*)$")
_DROP = re.compile(r"(?is)^\s*DROP\s+TEMPORARY\s+TABLE\s+IF\s+EXISTS\s+(?P<name>[A-Za-z_]\w*)\s*;?\s*$")
_READ = re.compile(r"(?is)^\s*\(*\s*(?:SELECT|WITH)\b")
#: What a read's answer may depend on beyond the tables it names: system tables, files and other sources, and the
#: functions whose value changes from one run to the next (a call spelled `name(`).
_VOLATILE = re.compile(
    r"(?i)\bsystem\s*\.|\b(?:now|now64|nowInBlock|today|yesterday|rand\w*|random\w*|fuzzBits|generateUUID\w*|"
    r"generateULID|generateSnowflakeID\w*|uptime|blockNumber|rowNumberInBlock|rowNumberInAllBlocks|"
    r"runningDifference\w*|runningAccumulate|neighbor|queryID|currentQueryID|initialQueryID|sleep\w*|file|url|s3\w*|"
    r"hdfs|remote\w*|cluster\w*|input|executable|dictGet\w*|dictHas|joinGet\w*|getSetting\w*|currentUser|"
    r"currentProfiles|currentRoles|hostName|fqdn|serverUUID|tcpPort|merge|numbers_mt|generateRandom|zeros_mt|"
    r"loop|view|viewIfPermitted|globalVariable)\s*\(")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: The version of a table a drop removed (a read naming it then fails, as the engine fails it).
ABSENT = "absent"
#: Answers larger than this are not kept (they are rows a page lists, cheap to read again).
MAX_KEPT_BYTES = 8 << 20


class Memo:
    """`inner` (an analysis.clickhouse Client), answering a repeated read and keeping a table made again alike
    from the first time (module docstring). `runs`, `answered` and `kept` count what the engine ran and what it
    did not."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.dsn = inner, inner.dsn
        self.epoch = 0  # the statements that may have changed any table so far
        self.versions: dict[str, str] = {}  # session table -> its version (ABSENT once dropped)
        self.held: dict[str, str] = {}  # dropped here, still on the engine: table -> its version
        self.answers: dict[tuple[str, str, int, tuple[tuple[str, str], ...]], pa.Table] = {}
        self.runs = self.answered = self.kept = 0

    def _named(self, sql: str, but: str = "") -> tuple[tuple[str, str], ...]:
        """The versions of the tables this client made that `sql` names (`but` left out)."""
        return tuple(sorted((n, self.versions[n]) for n in set(_NAME.findall(sql)) if n in self.versions and n != but))

    def _send_held(self, sql: str | None = None) -> None:
        """Send the held-back drops of the tables `sql` names (of all, without `sql`)."""
        names = [n for n in self.held if sql is None or re.search(rf"\b{n}\b", sql)]
        for name in names:
            del self.held[name]
            self._run_command(f"DROP TEMPORARY TABLE IF EXISTS {name}")

    def _run_command(self, sql: str) -> None:
        self.runs += 1
        try:
            self.inner.command(sql)
        except BaseException:
            self._changed()
            raise

    def _changed(self) -> None:
        """Any table may have changed: no earlier answer or version is used again."""
        self.epoch += 1
        self.answers.clear()

    def query(self, sql: str, settings: dict[str, Any] | None = None) -> pa.Table:
        """A read, answered from memory when it ran before on the same data (module docstring)."""
        if not _READ.match(sql) or _VOLATILE.search(sql):
            self._send_held()
            self.runs += 1
            out: pa.Table = self.inner.query(sql, settings)
            if not _READ.match(sql):
                self._changed()
            return out
        self._send_held(sql)
        key = (sql, repr(sorted((settings or {}).items())), self.epoch, self._named(sql))
        if key in self.answers:
            self.answered += 1
            return self.answers[key]
        self.runs += 1
        out = self.inner.query(sql, settings)
        if out.nbytes <= MAX_KEPT_BYTES:
            self.answers[key] = out
        return out

    def command(self, sql: str) -> None:
        """A statement: a session table's drop held back, made again or not (module docstring)."""
        drop, make = _DROP.match(sql), _CTAS.match(sql)
        if drop and drop["name"] in self.versions:
            if self.versions[drop["name"]] != ABSENT:  # held back; a table gone already: nothing to do
                self.held[drop["name"]] = self.versions[drop["name"]]
                self.versions[drop["name"]] = ABSENT
            return
        if drop:
            self._send_held(sql)
            self._run_command(sql)
            self.versions[drop["name"]] = ABSENT
            return
        if make and not _VOLATILE.search(make["read"]):
            name = make["name"]
            version = hashlib.sha256(repr((sql, self.epoch, self._named(sql, but=name))).encode()).hexdigest()
            if self.held.get(name) == version:
                del self.held[name]
                self.versions[name] = version
                self.kept += 1
                return
            self._send_held(sql)
            self._run_command(sql)
            self.versions[name] = version
            return
        self._send_held()
        self._run_command(sql)
        self._changed()

    def insert_arrow(self, table: str, data: pa.Table) -> None:
        """Append Arrow rows (any table may have changed after)."""
        self._send_held()
        try:
            self.inner.insert_arrow(table, data)
        finally:
            self._changed()

    def close(self) -> None:
        """Send the held-back drops and close the client."""
        try:
            self._send_held()
        finally:
            self.inner.close()
