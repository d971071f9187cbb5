"""A store's mapping: which spans are requests and which are stages, declared after the fact.

`tailscope map` saves one `Mapping` in the store (STORE/tailscope-map.json). Every reader of
the store applies it where it reads spans (`project_sql`, a projection of the span columns the
request model reads: IsRequest, Stage, Outcome, Tenant, Model, ModelVersion, InputTokens,
OutputTokens), so the request model, its materialized hours, report, sql, watch, cost and the
dashboard all see the same requests; nothing is re-ingested. The rules are expressions of
analysis.mapping.expr, compiled to the SQL of each engine (DuckDB, ClickHouse).

How the projection reads a span (docs/convention.md, "Already instrumented? Map it"):
- a span matching the request rule is a request (and no stage); a span matching a stage rule
  is that stage and no request (the first matching stage rule wins); any other span keeps what
  intake decided (the tailscope convention, gen_ai.*, an engine's mapping);
- a mapped request's outcome: the first outcome rule that matches; else a valid
  `tailscope.outcome`; else, for an HTTP server span (by default), status code 5xx is an error
  and 499 (client closed the request) is cancelled; else the span status (error, with
  `error.type` naming a timeout or a cancel);
- a shape rule (`attr:KEY` or `resource:KEY`) gives a request's tenant, model, model version or
  token counts where the span carries that key, else what intake promoted.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping as AnyMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analysis.engine.dialect import dialect as dialect_of
from analysis.mapping import expr as E
from tracing import schema as S
from tracing.errors import StoreError, TailscopeError

#: The mapping's file in a store's root directory.
MAP_FILE = "tailscope-map.json"
#: The format of that file.
MAP_VERSION = 1
#: Shape fields a rule may set: the name on the command line and the span column it fills.
SHAPE_COLUMNS: dict[str, str] = {"tenant": "Tenant", "model": "Model", "model_version": "ModelVersion",
                                 "input_tokens": "InputTokens", "output_tokens": "OutputTokens"}
_INTEGER_SHAPES = ("input_tokens", "output_tokens")
#: The default outcome rules of an HTTP server span (OpenTelemetry HTTP conventions: the stable key and the
#: deprecated one). 499 is the status nginx and most proxies log for a client that closed the connection.
HTTP_STATUS_KEYS: tuple[str, ...] = ("http.response.status_code", "http.status_code")
HTTP_OUTCOMES: tuple[tuple[str, str], ...] = (
    ("error", 'kind == "server" and (' + " or ".join(f"{k} >= 500" for k in HTTP_STATUS_KEYS) + ")"),
    ("cancelled", 'kind == "server" and (' + " or ".join(f"{k} == 499" for k in HTTP_STATUS_KEYS) + ")"),
)
#: What a mapped request carries as its engine in the recognition counts.
MAPPED_ENGINE = "map"


class MappingError(TailscopeError, ValueError):
    """A mapping rule that cannot be used (a bad expression, an unknown stage or shape field)."""


def _shape_sql(spec: str, dialect: str) -> str:
    source, _, key = spec.partition(":")
    return f"nullif({E.field_sql(E.Field(source, key, spec), dialect)}, '')"


def _parse_shape(name: str, spec: str) -> None:
    if name not in SHAPE_COLUMNS:
        raise MappingError(f"unknown shape field {name!r}: one of {', '.join(SHAPE_COLUMNS)}")
    source, sep, key = spec.partition(":")
    if not sep or source not in ("attr", "resource") or not key:
        raise MappingError(f"--{name.replace('_', '-')} {spec!r}: write attr:KEY (a span attribute of the request "
                           "span) or resource:KEY (a resource attribute)")


@dataclass(frozen=True)
class Mapping:
    """The rules: a request rule, stage rules (stage, expression), shape rules (field, attr:KEY) and outcome rules."""

    request: str | None = None
    stages: tuple[tuple[str, str], ...] = ()
    shape: tuple[tuple[str, str], ...] = ()
    outcomes: tuple[tuple[str, str], ...] = ()
    http_outcome: bool = True
    _parsed: dict[str, E.Node] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.request is None and not self.stages:
            raise MappingError("a mapping needs a request rule (--request) or a stage rule (--stage)")
        texts = [("--request", self.request)] if self.request is not None else []
        for stage, rule in self.stages:
            if stage not in S.ALL_STAGES:
                raise MappingError(f"--stage {stage}=...: unknown stage {stage!r}; one of {', '.join(S.ALL_STAGES)}")
            texts.append((f"--stage {stage}", rule))
        for outcome, rule in self.outcomes:
            if outcome not in S.OUTCOMES:
                raise MappingError(f"--outcome {outcome}=...: unknown outcome; one of {', '.join(S.OUTCOMES)}")
            texts.append((f"--outcome {outcome}", rule))
        for name, spec in self.shape:
            _parse_shape(name, spec)
        for where, text in texts:
            try:
                self._parsed[text] = E.parse(text)
            except E.ExpressionError as exc:
                raise MappingError(f"{where}: {exc}") from None

    # --- the SQL every reader applies ------------------------------------------------------------

    def rule_sql(self, text: str, dialect: str) -> str:
        """One rule's SQL in `dialect`."""
        return E.to_sql(self._parsed[text], dialect)

    def outcome_rules(self) -> tuple[tuple[str, str], ...]:
        """The outcome rules in the order they are tried: the declared ones, then the HTTP defaults."""
        return self.outcomes + (HTTP_OUTCOMES if self.http_outcome else ())

    def columns_sql(self, dialect: str) -> dict[str, str]:
        """Column name -> SQL of its mapped value over a span row, in `dialect`."""
        req = self.rule_sql(self.request, dialect) if self.request is not None else "false"
        stages = [(s, self.rule_sql(r, dialect)) for s, r in self.stages]
        any_stage = "(" + " OR ".join(sql for _, sql in stages) + ")" if stages else "false"
        stage_cases = " ".join(f"WHEN {sql} THEN {_q(s)}" for s, sql in stages)
        out = {
            "IsRequest": f"(CASE WHEN {req} THEN true WHEN {any_stage} THEN false ELSE IsRequest END)",
            "Stage": f"(CASE WHEN {req} THEN NULL {stage_cases} ELSE Stage END)",
        }
        if self.request is not None:
            out["Outcome"] = f"(CASE WHEN {req} THEN {self._outcome_sql(dialect)} ELSE Outcome END)"
        for name, spec in self.shape:
            column = SHAPE_COLUMNS[name]
            value = _shape_sql(spec, dialect)
            if name in _INTEGER_SHAPES:
                value = _int_sql(value, dialect)
            out[column] = f"coalesce({value}, {column})"
        return out

    def _outcome_sql(self, dialect: str) -> str:
        declared = E.field_sql(E.Field("attr", S.ATTR_OUTCOME, S.ATTR_OUTCOME), dialect)
        err = E.field_sql(E.Field("attr", S.ATTR_ERROR_TYPE, S.ATTR_ERROR_TYPE), dialect)
        err = dialect_of(dialect).replace_all(f"lower({err})", "_", "")
        rules = " ".join(f"WHEN {E.to_sql(E.parse(rule), dialect)} THEN {_q(outcome)}"
                         for outcome, rule in self.outcome_rules())
        outcomes = ", ".join(_q(o) for o in S.OUTCOMES)
        timeout = " OR ".join(f"{err} LIKE '%{w}%'" for w in TIMEOUT_WORDS)
        return (f"(CASE {rules} WHEN {declared} IN ({outcomes}) THEN {declared} "
                f"WHEN coalesce(StatusCode, '') <> 'Error' THEN 'ok' WHEN {timeout} THEN 'timeout' "
                f"WHEN {err} LIKE '%cancel%' THEN 'cancelled' ELSE 'error' END)")

    def project_sql(self, source: str, dialect: str = "duckdb") -> str:
        """A SELECT over `source` (span rows) with the mapped columns in place of the stored ones."""
        cols = ", ".join(f"{sql} AS {name}" for name, sql in self.columns_sql(dialect).items())
        return f"SELECT * REPLACE ({cols}) FROM {source}"

    def engine_sql(self, dialect: str = "duckdb") -> str:
        """The engine a request span is counted under: `map` for a mapped request, else its tailscope.engine."""
        req = self.rule_sql(self.request, dialect) if self.request is not None else "false"
        engine = E.field_sql(E.Field("attr", S.ATTR_ENGINE, S.ATTR_ENGINE), dialect)
        return f"(CASE WHEN {req} THEN {_q(MAPPED_ENGINE)} ELSE nullif({engine}, '') END)"

    def fingerprint(self) -> str:
        """Changes whenever what the mapping does changes (its rules or how they compile)."""
        return hashlib.sha256(self.project_sql("spans").encode()).hexdigest()

    # --- the file ----------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The mapping as saved in the store."""
        return {"version": MAP_VERSION, "request": self.request,
                "stages": [{"stage": s, "rule": r} for s, r in self.stages],
                "shape": {k: v for k, v in self.shape},
                "outcomes": [{"outcome": o, "rule": r} for o, r in self.outcomes],
                "http_outcome": self.http_outcome}

    @classmethod
    def from_json(cls, data: AnyMapping[str, Any]) -> Mapping:
        """The mapping of a saved file (MappingError when it is not one)."""
        if not isinstance(data, dict) or data.get("version") != MAP_VERSION:
            raise MappingError(f"not a version-{MAP_VERSION} mapping")
        try:
            return cls(request=data.get("request"),
                       stages=tuple((str(x["stage"]), str(x["rule"])) for x in data.get("stages", ())),
                       shape=tuple((str(k), str(v)) for k, v in dict(data.get("shape", {})).items()),
                       outcomes=tuple((str(x["outcome"]), str(x["rule"])) for x in data.get("outcomes", ())),
                       http_outcome=bool(data.get("http_outcome", True)))
        except (KeyError, TypeError, AttributeError) as exc:
            raise MappingError(f"a malformed mapping ({exc!r})") from None

    def command(self, store: str = "DIR") -> str:
        """The `tailscope map` command line that saves this mapping."""
        parts = ["tailscope map --store", _sh(store)]
        if self.request is not None:
            parts += ["--request", _sh(self.request)]
        for s, r in self.stages:
            parts += ["--stage", _sh(f"{s}={r}")]
        for k, v in self.shape:
            parts += [f"--{k.replace('_', '-')}", _sh(v)]
        for o, r in self.outcomes:
            parts += ["--outcome", _sh(f"{o}={r}")]
        if not self.http_outcome:
            parts.append("--no-http-outcome")
        return " ".join(parts)


#: Words of an `error.type` (lowercased, underscores removed) that make a failed request a timeout
#: (the rule of tracing.rows.outcome_of).
TIMEOUT_WORDS: tuple[str, ...] = ("timeout", "timedout", "deadline")


def _q(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _int_sql(value: str, dialect: str) -> str:
    d = dialect_of(dialect)
    return f"(CASE WHEN {d.regex_search(value, '^[0-9]{1,18}$')} THEN {d.int64(value)} END)"


def _sh(text: str) -> str:
    """`text` quoted for a POSIX shell."""
    return "'" + text.replace("'", "'\"'\"'") + "'"


def map_path(store: Path | str) -> Path:
    """Where a store keeps its mapping."""
    return Path(store) / MAP_FILE


def load(store: Path | str) -> Mapping | None:
    """The store's saved mapping, or None; StoreError (one line) when the file is there but unreadable."""
    path = map_path(store)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StoreError(f"{path}: cannot read the mapping ({exc.strerror})") from None
    return load_text(text, str(path))


def load_text(text: str, where: str) -> Mapping:
    """A mapping from the text of a mapping file; StoreError naming `where` when it is not one."""
    try:
        return Mapping.from_json(json.loads(text))
    except (ValueError, MappingError) as exc:
        raise StoreError(f"{where}: not a usable mapping ({exc}); fix it, or remove it with "
                         "tailscope map --reset") from None


def save(store: Path | str, mapping: Mapping) -> Path:
    """Write the mapping into the store (temporary file, fsync, rename: a reader sees the old or the new)."""
    from tracing.store import fsync_path, write_atomic

    path = map_path(store)
    write_atomic(path, (json.dumps(mapping.to_json(), indent=2) + "\n").encode())
    fsync_path(path.parent)
    return path


def reset(store: Path | str) -> bool:
    """Remove the store's mapping; True when there was one."""
    path = map_path(store)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def no_request_hint(store: Path | str) -> str:
    """What to do when a store holds spans but no request: the command that proposes a mapping."""
    return (f"if the store holds spans no rule recognises as requests, `tailscope map --suggest --store {store}` "
            "proposes the mapping that declares them (docs/convention.md#map)")


def project(source: str, mapping: Mapping | None, dialect: str = "duckdb") -> str:
    """`source` (a FROM item of span rows) with `mapping` applied, as a FROM item; `source` itself without one."""
    return source if mapping is None else f"({mapping.project_sql(source, dialect)})"
