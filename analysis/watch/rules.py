"""Watch rules: the SLO rules of a rules file (`p99(ttft) < 2s`, `error_rate < 1%`, burn rates) and their parser."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from analysis.percentiles import GROUP_COLUMNS, parse_duration
from tracing.errors import QueryError

#: Metrics the watch can detect spikes on and rules can name.
WATCH_METRICS: Final[tuple[str, ...]] = ("e2e", "ttft", "tpot")
NS: Final = 1_000_000_000


@dataclass(frozen=True)
class Rule:
    """One SLO rule of a rules file.

    kind: "percentile" (q of metric below threshold), "error_rate" (failed share below
    threshold) or "burn" (error-budget burn rate over a fast and a slow span, both above
    `rate` to fire). `where` filters requests on GROUP_COLUMNS values.
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


def parse_rule(line: str, where_from: str = "rule") -> Rule:
    """One rule from its text; QueryError naming `where_from` when it cannot be read."""
    text = line.split("#", 1)[0].strip()
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
                        threshold_ns=parse_duration(m.group(3)) * NS, where=tuple(where))
        if m := _ERRORS_RE.fullmatch(body):
            return Rule(text, "error_rate", threshold_ratio=float(m.group(1)) / 100, where=tuple(where))
        if m := _BURN_RE.fullmatch(body):
            objective = float(m.group(3)) / 100
            if not 0 < objective < 1:
                raise QueryError("", f"{where_from}: the objective must be between 0% and 100% (exclusive)")
            fast, slow = parse_duration(m.group(5)), parse_duration(m.group(6))
            if fast > slow:
                raise QueryError("", f"{where_from}: the fast span ({m.group(5)}) must not exceed the slow one")
            return Rule(text, "burn", metric=m.group(1), threshold_ns=parse_duration(m.group(2)) * NS,
                        objective=objective, rate=float(m.group(4)), fast_s=fast, slow_s=slow, where=tuple(where))
    except QueryError as exc:
        raise QueryError("", f"{where_from}: {exc.what}" if not exc.what.startswith(where_from)
                         else exc.what) from None
    raise QueryError("", f"{where_from}: cannot read rule {text!r}; write e.g. `p99(ttft) < 2s`, "
                         "`p99(e2e) < 20s for tenant=acme`, `error_rate < 1%` or "
                         "`burn(e2e < 20s, 99%) > 14.4 over 5m, 1h`")


def parse_rules(text: str, source: str = "rules") -> list[Rule]:
    """Every rule of a rules file (one per line; `#` starts a comment; blank lines skipped)."""
    rules = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.split("#", 1)[0].strip():
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
