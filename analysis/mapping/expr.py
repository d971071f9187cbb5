"""The rule language of `tailscope map`: one boolean expression over a span, parsed once, compiled to SQL.

    expr    := or
    or      := and ("or" and)*
    and     := not ("and" not)*
    not     := "not" not | "(" expr ")" | "exists" "(" field ")" | field op value
    op      := "==" | "!=" | "=~" | "!~" | "<" | "<=" | ">" | ">=" | "in" | "not" "in"
    value   := string | number | "[" value ("," value)* "]"     (a list only after in / not in)
    field   := name | kind | status | service | scope            (the span's own columns)
             | resource.KEY | resource["KEY"]                    (a resource attribute)
             | attributes.KEY | attributes["KEY"] | KEY          (a span attribute, e.g. http.route)

A missing attribute reads as the empty string, so every comparison is true or false (never
unknown) and `not` is plain negation. `==` / `!=` / `in` with a number compare numerically (the
value read as a number; one that does not read is unequal to every number); `<` ... `>=` take
numbers only; an attribute reads as a number when it is a plain decimal (digits, an optional
sign and fraction). `=~` is an RE2 regular expression searched anywhere in the value (anchor it with
^...$). `kind` and `status` take their OpenTelemetry names in any case ("SERVER", "server",
"SPAN_KIND_SERVER"). A mistake raises `ExpressionError` with the column where it is.

`to_sql` compiles an expression for a dialect ("duckdb", "clickhouse"); `evaluate` is the same rule
over one span in plain Python (the reference the tests compare the SQL with, and what
`tailscope map --suggest` checks its rules with).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any

from analysis.engine.dialect import DIALECTS as _DIALECTS
from analysis.engine.dialect import dialect as dialect_of
from tracing import schema as S
from tracing.errors import TailscopeError

#: The span's own columns an expression may name, and the stored column each one reads.
SPAN_FIELDS: dict[str, str] = {"name": "SpanName", "kind": "SpanKind", "status": "StatusCode",
                               "service": "ServiceName", "scope": "ScopeName"}
#: Stored spellings of the enumerated fields, by their lowercase names.
_ENUMS: dict[str, dict[str, str]] = {
    "kind": {k.lower(): k for k in S.SPAN_KINDS} | {f"span_kind_{k.lower()}": k for k in S.SPAN_KINDS},
    "status": {k.lower(): k for k in S.STATUS_CODES} | {f"status_code_{k.lower()}": k for k in S.STATUS_CODES},
}
_KEYWORDS = ("and", "or", "not", "in", "exists")
_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<op>==|!=|=~|!~|<=|>=|<|>)
  | (?P<punct>[()\[\],])
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<number>-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?(?![A-Za-z_.]))
  | (?P<ident>[A-Za-z_][A-Za-z0-9_.\-]*)
""", re.VERBOSE)


class ExpressionError(TailscopeError, ValueError):
    """An expression that does not parse or compile; `column` (1-based) is where it goes wrong."""

    def __init__(self, text: str, column: int, what: str) -> None:
        self.text = text
        self.column = column
        self.what = what
        super().__init__(f"column {column} of {text!r}: {what}")


@dataclass(frozen=True)
class Field:
    """What a comparison reads: a span column ("span", stored column), a span or a resource attribute."""

    source: str  # "span", "attr", "resource"
    key: str
    label: str = dc_field(default="", compare=False)  # as written, for messages


@dataclass(frozen=True)
class Cmp:
    """`field op value`; `values` holds one value, or the list of `in`."""

    field: Field
    op: str
    values: tuple[str | float, ...]


@dataclass(frozen=True)
class Exists:
    """`exists(field)`: the attribute is present (a span column always is)."""

    field: Field


@dataclass(frozen=True)
class Not:
    """`not x`."""

    arg: Node


@dataclass(frozen=True)
class BoolOp:
    """`a and b and ...` / `a or b or ...`."""

    op: str
    args: tuple[Node, ...]


Node = Cmp | Exists | Not | BoolOp


@dataclass(frozen=True)
class _Tok:
    kind: str
    text: str
    col: int


def _tokens(text: str) -> list[_Tok]:
    out: list[_Tok] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            hint = " (compare with ==)" if text[pos] == "=" else ""
            raise ExpressionError(text, pos + 1, f"unexpected character {text[pos]!r}{hint}")
        kind = m.lastgroup or ""
        if kind != "ws":
            word = m.group()
            if kind == "ident" and word in _KEYWORDS:
                kind = word
            out.append(_Tok(kind, word, pos + 1))
        pos = m.end()
    out.append(_Tok("end", "", len(text) + 1))
    return out


def _unquote(tok: _Tok, text: str) -> str:
    body = tok.text[1:-1]
    out: list[str] = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch == "\\":
            nxt = body[i + 1]
            mapped = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'"}.get(nxt)
            if mapped is None:
                raise ExpressionError(text, tok.col + i + 1, f"unknown escape \\{nxt} (use \\\\ for a backslash)")
            out.append(mapped)
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _tokens(text)
        self.i = 0

    def peek(self) -> _Tok:
        return self.toks[self.i]

    def take(self, kind: str, what: str) -> _Tok:
        tok = self.peek()
        if tok.kind != kind and tok.text != kind:
            self.fail(tok, f"expected {what}, found {self.describe(tok)}")
        self.i += 1
        return tok

    def describe(self, tok: _Tok) -> str:
        return "the end" if tok.kind == "end" else repr(tok.text)

    def fail(self, tok: _Tok, what: str) -> None:
        raise ExpressionError(self.text, tok.col, what)

    def parse(self) -> Node:
        if self.peek().kind == "end":
            self.fail(self.peek(), "empty expression")
        node = self.or_()
        tok = self.peek()
        if tok.kind != "end":
            self.fail(tok, f"expected and, or or the end, found {self.describe(tok)}")
        return node

    def chain(self, op: str, operand: Callable[[], Node]) -> Node:
        """`operand (op operand)*`: one BoolOp of every operand, or the operand alone."""
        args = [operand()]
        while self.peek().kind == op:
            self.i += 1
            args.append(operand())
        return args[0] if len(args) == 1 else BoolOp(op, tuple(args))

    def or_(self) -> Node:
        return self.chain("or", self.and_)

    def and_(self) -> Node:
        return self.chain("and", self.not_)

    def not_(self) -> Node:
        tok = self.peek()
        if tok.kind == "not":
            self.i += 1
            return Not(self.not_())
        if tok.text == "(":
            self.i += 1
            node = self.or_()
            self.take(")", "')'")
            return node
        if tok.kind == "exists":
            self.i += 1
            self.take("(", "'(' after exists")
            field = self.field()
            self.take(")", "')'")
            return Exists(field)
        return self.comparison()

    def field(self) -> Field:
        tok = self.peek()
        if tok.kind != "ident":
            self.fail(tok, f"expected a field (name, kind, status, service, scope, an attribute key or "
                           f"resource.KEY), found {self.describe(tok)}")
        self.i += 1
        word = tok.text
        if word in ("attributes", "resource") and self.peek().text == "[":
            self.i += 1
            key = _unquote(self.take("string", "a quoted key"), self.text)
            self.take("]", "']'")
            return Field("attr" if word == "attributes" else "resource", key, f'{word}["{key}"]')
        if word in SPAN_FIELDS:
            return Field("span", word, word)
        for prefix, source in (("resource.", "resource"), ("attributes.", "attr")):
            if word.startswith(prefix):
                if len(word) == len(prefix):
                    self.fail(tok, f"a key is missing after {prefix!r}")
                return Field(source, word[len(prefix):], word)
        if word in ("attributes", "resource"):
            self.fail(tok, f"{word} needs a key: {word}.KEY or {word}[\"KEY\"]")
        return Field("attr", word, word)

    def value(self) -> tuple[str | float, _Tok]:
        tok = self.peek()
        if tok.kind == "string":
            self.i += 1
            return _unquote(tok, self.text), tok
        if tok.kind == "number":
            self.i += 1
            number = float(tok.text)
            if not math.isfinite(number):
                self.fail(tok, "a number too large")
            return number, tok
        self.fail(tok, f"expected a quoted string or a number, found {self.describe(tok)}")
        raise AssertionError  # unreachable: fail raises

    def comparison(self) -> Node:
        field = self.field()
        tok = self.peek()
        negated_in = False
        if tok.kind == "not":
            self.i += 1
            tok = self.peek()
            if tok.kind != "in":
                self.fail(tok, f"expected in after not, found {self.describe(tok)}")
            negated_in = True
        if tok.kind == "in":
            self.i += 1
            self.take("[", "'[' starting the list of in")
            values: list[tuple[str | float, _Tok]] = [self.value()]
            while self.peek().text == ",":
                self.i += 1
                values.append(self.value())
            self.take("]", "',' or ']'")
            for v, vtok in values:
                self.check(field, "in", v, vtok)
            node: Node = Cmp(field, "in", tuple(self.norm(field, v) for v, _ in values))
            return Not(node) if negated_in else node
        if tok.kind != "op":
            self.fail(tok, f"expected an operator (==, !=, =~, !~, <, <=, >, >=, in) after {field.label}, "
                           f"found {self.describe(tok)}")
        self.i += 1
        value, vtok = self.value()
        self.check(field, tok.text, value, vtok)
        if tok.text in ("=~", "!~"):
            _check_regex(self.text, vtok, str(value))
        return Cmp(field, tok.text, (self.norm(field, value),))

    def check(self, field: Field, op: str, value: str | float, tok: _Tok) -> None:
        if op in ("<", "<=", ">", ">=") and not isinstance(value, float):
            self.fail(tok, f"{op} compares numbers: write the number without quotes")
        if op in ("=~", "!~") and not isinstance(value, str):
            self.fail(tok, f"{op} takes a quoted regular expression")
        enum = field.source == "span" and field.key in _ENUMS and op in ("==", "!=", "in")
        if enum and (not isinstance(value, str) or value.lower() not in _ENUMS[field.key]):
            names = ", ".join(S.SPAN_KINDS if field.key == "kind" else S.STATUS_CODES)
            self.fail(tok, f"{field.key} is one of {names}")

    def norm(self, field: Field, value: str | float) -> str | float:
        if field.source == "span" and field.key in _ENUMS and isinstance(value, str):
            return _ENUMS[field.key].get(value.lower(), value)
        return value


#: Regular-expression syntax RE2 (DuckDB's and ClickHouse's engine) does not have.
_NOT_RE2 = re.compile(r"\(\?[=!<]|\(\?P=|\\[1-9]")


def _check_regex(text: str, tok: _Tok, rx: str) -> None:
    try:
        re.compile(rx)
    except re.error as exc:
        raise ExpressionError(text, tok.col + 1 + (exc.pos or 0), f"bad regular expression ({exc.msg})") from None
    bad = _NOT_RE2.search(rx)
    if bad is not None:
        raise ExpressionError(text, tok.col + 1 + bad.start(),
                              "lookarounds and backreferences are not RE2: the SQL engines cannot run them")


def parse(text: str) -> Node:
    """Parse one expression; ExpressionError (with the column) when it is not one."""
    return _Parser(text).parse()


# --- SQL ------------------------------------------------------------------------------------------


def quote(text: str, dialect: str) -> str:
    """A string literal `dialect` reads back as `text`."""
    return dialect_of(dialect).literal(text)


def _num(value: float) -> str:
    return repr(float(value))


#: The attribute values a numeric comparison reads as numbers: a plain decimal (no exponent, no spaces).
NUMBER = r"^[-+]?[0-9]{1,15}([.][0-9]{1,15})?$"
DIALECTS: tuple[str, ...] = tuple(_DIALECTS)


def field_sql(field: Field, dialect: str) -> str:
    """SQL text of what `field` reads on a span row ('' when an attribute is absent)."""
    if field.source == "span":
        return f"coalesce({SPAN_FIELDS[field.key]}, '')"
    return dialect_of(dialect).map_get("SpanAttributes" if field.source == "attr" else "ResourceAttributes",
                                       field.key)


def number_sql(x: str, dialect: str) -> str:
    """The number text `x` holds when it is a plain decimal (NUMBER), else NULL."""
    d = dialect_of(dialect)
    return f"(CASE WHEN {d.regex_search(x, NUMBER)} THEN {d.to_double_or_null(x)} END)"


def to_sql(node: Node, dialect: str) -> str:
    """A SQL boolean (never NULL) over the span columns of one row, in `dialect`."""
    d = dialect_of(dialect)
    if isinstance(node, BoolOp):
        return "(" + f" {node.op.upper()} ".join(to_sql(a, dialect) for a in node.args) + ")"
    if isinstance(node, Not):
        return f"(NOT {to_sql(node.arg, dialect)})"
    if isinstance(node, Exists):
        f = node.field
        if f.source == "span":
            return "true"
        return d.map_has("SpanAttributes" if f.source == "attr" else "ResourceAttributes", f.key)
    x = field_sql(node.field, dialect)
    op, values = node.op, node.values
    if op in ("=~", "!~"):
        m = d.regex_search(x, str(values[0]))
        return f"({m})" if op == "=~" else f"(NOT {m})"
    if all(isinstance(v, float) for v in values):
        number = number_sql(x, dialect)
        if op == "in":
            return f"coalesce({number} IN ({', '.join(_num(float(v)) for v in values)}), false)"
        sql_op = {"==": "="}.get(op, op)
        test = f"coalesce({number} {'=' if op == '!=' else sql_op} {_num(float(values[0]))}, false)"
        return f"(NOT {test})" if op == "!=" else test
    texts = [v if isinstance(v, str) else _canonical(v) for v in values]
    if op == "in":
        return f"({x} IN ({', '.join(quote(t, dialect) for t in texts)}))"
    return f"({x} {'=' if op == '==' else '<>'} {quote(texts[0], dialect)})"


def _canonical(value: float) -> str:
    return str(int(value)) if value.is_integer() else repr(value)


# --- the reference: one span in plain Python ---------------------------------------------------------


def _read_number(text: str) -> float | None:
    """A plain decimal (NUMBER) as a number, else None."""
    return float(text) if re.search(NUMBER, text) else None


def evaluate(node: Node, span: Mapping[str, Any]) -> bool:
    """The expression on one span row (SpanName, SpanKind, ..., SpanAttributes, ResourceAttributes as dicts)."""
    if isinstance(node, BoolOp):
        results = [evaluate(a, span) for a in node.args]
        return all(results) if node.op == "and" else any(results)
    if isinstance(node, Not):
        return not evaluate(node.arg, span)
    f = node.field
    column = {"attr": "SpanAttributes", "resource": "ResourceAttributes"}.get(f.source)
    if isinstance(node, Exists):
        return column is None or f.key in dict(span[column] or {})
    x = str(span[SPAN_FIELDS[f.key]] or "") if column is None else str(dict(span[column] or {}).get(f.key, ""))
    op, values = node.op, node.values
    if op in ("=~", "!~"):
        return (re.search(str(values[0]), x, re.ASCII) is not None) == (op == "=~")
    if all(isinstance(v, float) for v in values):
        n = _read_number(x)
        if n is None:
            return op == "!="
        v0 = float(values[0])
        return {"in": lambda: n in [float(v) for v in values], "==": lambda: n == v0, "!=": lambda: n != v0,
                "<": lambda: n < v0, "<=": lambda: n <= v0, ">": lambda: n > v0, ">=": lambda: n >= v0}[op]()
    texts = [v if isinstance(v, str) else _canonical(v) for v in values]
    if op == "in":
        return x in texts
    return (x == texts[0]) == (op == "==")


def keys_read(node: Node) -> set[tuple[str, str]]:
    """The (source, key) pairs an expression reads: what `--suggest` shows as evidence."""
    if isinstance(node, BoolOp):
        return set().union(*(keys_read(a) for a in node.args))
    if isinstance(node, Not):
        return keys_read(node.arg)
    return {(node.field.source, node.field.key)}


def _text_value(value: str | float) -> str:
    if isinstance(value, float):
        return _canonical(value)
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t") + '"'


def _text_field(f: Field) -> str:
    if f.source == "span":
        return f.key
    prefix = "attributes" if f.source == "attr" else "resource"
    return f'{prefix}[{_text_value(f.key)}]'


def to_text(node: Node) -> str:
    """The expression written back in the rule language (`parse(to_text(n)) == n`)."""
    if isinstance(node, BoolOp):
        return "(" + f" {node.op} ".join(to_text(a) for a in node.args) + ")"
    if isinstance(node, Not):
        return f"not {to_text(node.arg)}"
    if isinstance(node, Exists):
        return f"exists({_text_field(node.field)})"
    if node.op == "in":
        return f"{_text_field(node.field)} in [{', '.join(_text_value(v) for v in node.values)}]"
    return f"{_text_field(node.field)} {node.op} {_text_value(node.values[0])}"
