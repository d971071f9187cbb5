"""Watch rules: the SLO rules of a rules file (`p99(ttft) < 2s`, `error_rate < 1%`, burn rates) and their parser."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from analysis.engine.percentiles import GROUP_COLUMNS, parse_duration
from tracing.errors import QueryError

#: Metrics the watch can detect spikes on and rules can name.
WATCH_METRICS: Final[tuple[str, ...]] = ("e2e", "ttft", "tpot")
NS: Final = 1_000_000_000


@dataclass(frozen=True)
class Rule:
    """One SLO rule of a rules file.

    kind: "percentile" (q of metric below threshold), "error_rate" (failed share below
    threshold) or "burn" (error-budget burn rate over a fast and a slow span, both above
    `rate` to fire); "tail_spike" is the line that sets the tail-spike alert's labels and
    annotations (it is not evaluated as a rule). `where` filters requests on GROUP_COLUMNS
    values; `labels` and `annotations` are added to the alert, as a Prometheus rule's are.
    """

    text: str
    kind: str
    metric: str = "e2e"
    q: float = 0.99
    threshold_ns: float = 0.0
    threshold_ratio: float = 0.0
    objective: float = 0.99
    rate: float = 1.0
    fast_s: float = 300.0
    slow_s: float = 3600.0
    where: tuple[tuple[str, str], ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()

    @property
    def key(self) -> str:
        """The state key of the rule (its normalized text)."""
        return "slo:" + " ".join(self.text.split())


_DUR = r"([0-9]*\.?[0-9]+\s*(?:ms|s|m|h|d)?)"
_PCT = r"([0-9]*\.?[0-9]+)\s*%"
_METRIC = r"(e2e|ttft|tpot)"
_PERCENTILE_RE = re.compile(rf"p([0-9]{{1,2}}(?:\.[0-9]+)?)\(\s*{_METRIC}\s*\)\s*<\s*{_DUR}")
_ERRORS_RE = re.compile(rf"error_rate\s*<\s*{_PCT}")
_BURN_RE = re.compile(rf"burn\(\s*{_METRIC}\s*<\s*{_DUR}\s*,\s*{_PCT}\s*\)\s*>\s*([0-9]*\.?[0-9]+)\s*"
                      rf"over\s+{_DUR}\s*,\s*{_DUR}")


#: The alert's own labels, which a rule's `labels {...}` may not set (they identify the alert).
RESERVED_LABELS: Final = frozenset({"alertname", "alert_id", "source", "kind", "rule"})
_LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_PAIR_RE = re.compile(r'\s*([^\s=,{}"]+)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')
_CLAUSE_RE = re.compile(r"\b(labels|annotations)\s*\{")


def _strip_comment(line: str) -> str:
    """The line without its `#` comment (a `#` inside double quotes is kept: URLs in annotations)."""
    quoted = False
    for i, ch in enumerate(line):
        if ch == '"' and (i == 0 or line[i - 1] != "\\"):
            quoted = not quoted
        elif ch == "#" and not quoted:
            return line[:i]
    return line


def _pairs(text: str, what: str, where_from: str) -> tuple[tuple[str, str], ...]:
    """`k="v", k2="v2"` as pairs; QueryError naming the clause when it cannot be read."""
    out: list[tuple[str, str]] = []
    pos, text = 0, text.strip()
    while pos < len(text):
        m = _PAIR_RE.match(text, pos)
        if m is None:
            raise QueryError("", f"{where_from}: cannot read {what} {{{text}}}; write e.g. "
                                 f'{what} {{severity="page", team="gpu"}}')
        name = m.group(1)
        if what == "labels" and (not _LABEL_NAME_RE.fullmatch(name) or name in RESERVED_LABELS):
            own = ", ".join(sorted(RESERVED_LABELS))
            raise QueryError("", f"{where_from}: {name!r} cannot be a label here (a label name is "
                                 f"[a-zA-Z_][a-zA-Z0-9_]*, and {own} are the alert's own)")
        out.append((name, re.sub(r"\\(.)", r"\1", m.group(2))))
        pos = m.end()
    return tuple(out)


def _clauses(text: str, where_from: str) -> tuple[str, dict[str, tuple[tuple[str, str], ...]]]:
    """(the rule's text before its clauses, {"labels": pairs, "annotations": pairs})."""
    found: dict[str, tuple[tuple[str, str], ...]] = {}
    m = _CLAUSE_RE.search(text)
    head = text if m is None else text[:m.start()]
    while m is not None:
        close = text.find("}", m.end())
        while close != -1 and text[m.end():close].count('"') % 2:  # a `}` inside a quoted value
            close = text.find("}", close + 1)
        if close == -1:
            raise QueryError("", f"{where_from}: {m.group(1)} {{ is not closed")
        found[m.group(1)] = _pairs(text[m.end():close], m.group(1), where_from)
        rest = text[close + 1:]
        m = _CLAUSE_RE.match(rest.strip()) if rest.strip() else None
        if rest.strip() and m is None:
            raise QueryError("", f"{where_from}: cannot read {rest.strip()!r} after the {{...}} clause")
        text = rest.strip()
    return head.strip(), found


def parse_rule(line: str, where_from: str = "rule") -> Rule:
    """One rule from its text; QueryError naming `where_from` when it cannot be read.

    A rule may end with `labels {k="v", ...}` and `annotations {k="v", ...}`; the line
    `tail_spike labels {...} annotations {...}` sets them for the tail-spike alert.
    """
    text, extra = _clauses(_strip_comment(line).strip(), where_from)
    labels, annotations = extra.get("labels", ()), extra.get("annotations", ())
    if text == "tail_spike":
        return Rule("tail_spike", "tail_spike", labels=labels, annotations=annotations)
    body, _, filt = text.partition(" for ")
    body = body.strip()
    where: list[tuple[str, str]] = []
    for part in (p.strip() for p in filt.split(",") if p.strip()):
        name, eq, value = part.partition("=")
        if not eq or name.strip() not in GROUP_COLUMNS or not value.strip():
            raise QueryError("", f"{where_from}: cannot read filter {part!r}; write e.g. `for tenant=acme` "
                                 f"(columns: {', '.join(GROUP_COLUMNS)})")
        where.append((name.strip(), value.strip()))
    try:
        if m := _PERCENTILE_RE.fullmatch(body):
            q = float(m.group(1)) / 100
            if not 0 < q < 1:
                raise QueryError("", f"{where_from}: percentile must be between p1 and p99.9")
            return Rule(text, "percentile", metric=m.group(2), q=q,
                        threshold_ns=parse_duration(m.group(3)) * NS, where=tuple(where), labels=labels,
                        annotations=annotations)
        if m := _ERRORS_RE.fullmatch(body):
            return Rule(text, "error_rate", threshold_ratio=float(m.group(1)) / 100, where=tuple(where),
                        labels=labels, annotations=annotations)
        if m := _BURN_RE.fullmatch(body):
            objective = float(m.group(3)) / 100
            if not 0 < objective < 1:
                raise QueryError("", f"{where_from}: the objective must be between 0% and 100% (exclusive)")
            fast, slow = parse_duration(m.group(5)), parse_duration(m.group(6))
            if fast > slow:
                raise QueryError("", f"{where_from}: the fast span ({m.group(5)}) must not exceed the slow one")
            return Rule(text, "burn", metric=m.group(1), threshold_ns=parse_duration(m.group(2)) * NS,
                        objective=objective, rate=float(m.group(4)), fast_s=fast, slow_s=slow, where=tuple(where),
                        labels=labels, annotations=annotations)
    except QueryError as exc:
        raise QueryError("", f"{where_from}: {exc.what}" if not exc.what.startswith(where_from)
                         else exc.what) from None
    raise QueryError("", f"{where_from}: cannot read rule {text!r}; write e.g. `p99(ttft) < 2s`, "
                         "`p99(e2e) < 20s for tenant=acme`, `error_rate < 1%`, "
                         "`burn(e2e < 20s, 99%) > 14.4 over 5m, 1h` or `tail_spike labels {severity=\"page\"}`")


def parse_rules(text: str, source: str = "rules") -> list[Rule]:
    """Every rule of a rules file (one per line; `#` starts a comment; blank lines skipped)."""
    rules = []
    for n, line in enumerate(text.splitlines(), 1):
        if _strip_comment(line).strip():
            rules.append(parse_rule(line, f"{source}:{n}"))
    keys = [r.key for r in rules]
    dup = next((k for k in keys if keys.count(k) > 1), None)
    if dup:
        raise QueryError("", f"{source}: rule {dup[4:]!r} is written twice")
    return rules


def load_rules(path: Path) -> list[Rule]:
    """The rules of a file; QueryError with the path when it is missing or wrong."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise QueryError("", f"{path}: cannot read the rules file ({exc.strerror})") from None
    return parse_rules(text, str(path))
