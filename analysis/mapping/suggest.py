"""Propose a mapping from a store's span trees: `tailscope map --suggest`.

It reads the spans as stored (no mapping applied) and looks for what a web framework's
auto-instrumentation and hand-written spans leave: root SERVER spans (no parent in the store, or a
CLIENT parent: a request from another service) grouped by `http.route` (else by name), their
children's names, how many requests have each and what share of the root's time it takes. The
request rule is the route (or name) with the most time served; each child name is given the stage
its words say (tokenize -> preprocess, generate -> generation, stream -> streaming, ...); a child
whose name says nothing is left out and listed. Shape rules come from the request spans' attribute
keys (tenant, model, tokens). Every rule comes with its evidence, and the whole is a ready-to-run
`tailscope map` command that `Mapping` has checked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from analysis.mapping.rules import Mapping
from tracing import schema as S

#: Words in a child span's name and the stage they say, tried in order (the first that matches wins).
STAGE_WORDS: tuple[tuple[str, str], ...] = (
    (S.PREPROCESS, r"tokeni[sz]|preprocess|pre_process|template|validat|encode_prompt|prompt|parse"),
    (S.QUEUE_WAIT, r"queue|wait|schedul|admission|acquire"),
    (S.MODEL_LOAD, r"load_model|model_load|warm|cold_start|load_weights"),
    (S.PREFILL, r"prefill|pre_fill"),
    (S.DECODE, r"^decode$|decode_loop|decode_step"),
    (S.STREAMING, r"stream|sse|send_|respond|response|write_|flush"),
    (S.GENERATION, r"generat|infer|predict|complet|llm|forward|model|sampl"),
    (S.NETWORK, r"upload|download|network|proxy|transfer"),
)
#: Attribute keys of a request span, by the shape field they give (a key containing one of the words).
SHAPE_WORDS: tuple[tuple[str, str], ...] = (
    ("tenant", r"(^|\.)(customer|tenant|org|organization|account)(\.|_)?id$|^enduser\.id$|^user\.id$"),
    ("model", r"(^|\.)model(\.name|_name)?$"),
    ("input_tokens", r"(prompt|input)_?tokens$"),
    ("output_tokens", r"(completion|output|generated)_?tokens$"),
)
#: Keys intake already promotes (tracing.schema): a shape rule for them would change nothing.
_PROMOTED_PREFIXES = ("gen_ai.", "tailscope.")
#: A child must be under this share of requests at least to get a rule.
MIN_CHILD_SHARE = 0.2


@dataclass
class Suggestion:
    """A proposed mapping, the evidence of each rule, and the children left out (with theirs)."""

    mapping: Mapping | None
    evidence: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)
    why_none: str = ""


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def stage_of_name(name: str) -> str | None:
    """The stage a child span's name says, or None."""
    low = name.lower()
    for stage, words in STAGE_WORDS:
        if re.search(words, low):
            return stage
    return None


def suggest(con: Any, source: str) -> Suggestion:
    """A mapping for the spans in `source` (a FROM item of stored span rows) on a DuckDB connection `con`."""
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _suggest_spans AS
        SELECT TraceId, SpanId, ParentSpanId, SpanName, SpanKind, Duration, SpanAttributes,
               coalesce(SpanAttributes['http.route'], '') AS route
        FROM {source}""")
    con.execute("""
        CREATE OR REPLACE TEMP TABLE _suggest_roots AS
        SELECT r.* FROM _suggest_spans r
        LEFT JOIN _suggest_spans p ON p.TraceId = r.TraceId AND p.SpanId = r.ParentSpanId
        WHERE r.SpanKind = 'Server' AND (p.SpanId IS NULL OR p.SpanKind = 'Client')""")
    try:
        return _suggest(con)
    finally:
        con.execute("DROP TABLE IF EXISTS _suggest_roots")
        con.execute("DROP TABLE IF EXISTS _suggest_spans")


def _suggest(con: Any) -> Suggestion:
    total = con.execute("SELECT count(*) FROM _suggest_roots").fetchone()[0]
    if not total:
        return Suggestion(None, why_none="no root SERVER span (no parent in the store, or a CLIENT parent): "
                                         "write the request rule yourself (docs/convention.md)")
    groups = con.execute("""
        SELECT route, CASE WHEN route = '' THEN SpanName ELSE '' END AS name, count(*) AS n,
               sum(Duration) AS served, median(Duration) AS p50
        FROM _suggest_roots GROUP BY ALL ORDER BY served DESC, n DESC, route, name LIMIT 1""").fetchall()
    route, name, n, _, p50 = groups[0]
    if route:
        rule = f"http.route == {_q(route)}"
        picked = "route = ?"
        key = route
        what = f"http.route {route}"
    else:
        rule = f'kind == "server" and name == {_q(name)}'
        picked = "route = '' AND SpanName = ?"
        key = name
        what = f"name {name!r}"
    evidence = [f"--request: {n:,} of {total:,} root SERVER spans have {what} (median {p50 / 1e6:,.1f} ms): "
                "the most time served"]
    children = con.execute(f"""
        WITH req AS (SELECT TraceId, SpanId, Duration FROM _suggest_roots WHERE {picked})
        SELECT c.SpanName, count(DISTINCT c.TraceId || c.ParentSpanId) AS n,
               avg(c.Duration / greatest(r.Duration, 1)) AS share
        FROM req r JOIN _suggest_spans c ON c.TraceId = r.TraceId AND c.ParentSpanId = r.SpanId
        GROUP BY 1 ORDER BY n DESC, share DESC, 1""", [key]).fetchall()
    stages: list[tuple[str, str]] = []
    left_out: list[str] = []
    taken: set[str] = set()
    for child, k, share in children:
        stage = stage_of_name(child)
        seen = f"in {k / n:.0%} of the requests, {share:.0%} of their time on average"
        if stage is None or k / n < MIN_CHILD_SHARE or stage in taken:
            reason = ("its name says no stage" if stage is None else
                      f"in too few requests (under {MIN_CHILD_SHARE:.0%})" if k / n < MIN_CHILD_SHARE
                      else f"{stage} is taken by a more common child")
            left_out.append(f"{child!r}: {seen}; not mapped: {reason}")
            continue
        taken.add(stage)
        stages.append((stage, f"name == {_q(child)}"))
        evidence.append(f"--stage {stage}: child span {child!r} {seen}")
    shape: list[tuple[str, str]] = []
    keys = con.execute(f"""
        SELECT k, count(*) AS n FROM (SELECT unnest(map_keys(SpanAttributes)) AS k FROM _suggest_roots
                                      WHERE {picked}) GROUP BY k ORDER BY n DESC, k""", [key]).fetchall()
    for field_name, words in SHAPE_WORDS:
        for k, count in keys:
            if k.startswith(_PROMOTED_PREFIXES) or not re.search(words, k.lower()):
                continue
            shape.append((field_name, f"attr:{k}"))
            evidence.append(f"--{field_name.replace('_', '-')}: attribute {k} on {count / n:.0%} of the request spans")
            break
    return Suggestion(Mapping(request=rule, stages=tuple(stages), shape=tuple(shape)), evidence, left_out)
