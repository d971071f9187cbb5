"""`tailscope map`: declare which spans are requests and which are stages, on a store, without re-ingesting."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from tailscope.commands.common import StoreOption, console, err_console, errors_as_messages, fail, store_path

#: Third-party packages the command needs (imported when it runs, so `tailscope --help` starts fast).
NEEDS = ("duckdb", "pyarrow")

_SHAPE_HELP = "attr:KEY (a span attribute of the request span) or resource:KEY (a resource attribute)"


def _pairs(values: list[str], option: str) -> tuple[tuple[str, str], ...]:
    out = []
    for value in values:
        name, sep, rule = value.partition("=")
        if not sep or not name.strip() or "=" in name or not rule.strip():
            fail(f"{option} {value!r}: write NAME=EXPRESSION, e.g. {option} 'preprocess=name == \"tokenize\"'")
        out.append((name.strip(), rule.strip()))
    return tuple(out)


def map_command(
    store: StoreOption = None,
    request: Annotated[str | None, typer.Option(
        "--request", help="Expression selecting the span that is one request, e.g. "
        "'http.route == \"/v1/chat/completions\"' (docs/convention.md#map).")] = None,
    stage: Annotated[list[str] | None, typer.Option(
        "--stage", help="STAGE=EXPRESSION: spans that are that stage (a child of the request span); repeatable; "
        "the first matching rule wins.")] = None,
    tenant: Annotated[str | None, typer.Option("--tenant", help=f"The request's tenant: {_SHAPE_HELP}.")] = None,
    model: Annotated[str | None, typer.Option("--model", help=f"The request's model: {_SHAPE_HELP}.")] = None,
    model_version: Annotated[str | None, typer.Option(
        "--model-version", help=f"The request's model version: {_SHAPE_HELP}.")] = None,
    input_tokens: Annotated[str | None, typer.Option(
        "--input-tokens", help=f"The request's input token count: {_SHAPE_HELP}.")] = None,
    output_tokens: Annotated[str | None, typer.Option(
        "--output-tokens", help=f"The request's output token count: {_SHAPE_HELP}.")] = None,
    outcome: Annotated[list[str] | None, typer.Option(
        "--outcome", help="OUTCOME=EXPRESSION (error, timeout, cancelled or ok) for a mapped request span; "
        "repeatable, tried in order before the defaults.")] = None,
    http_outcome: Annotated[bool, typer.Option(
        "--http-outcome/--no-http-outcome", help="HTTP server spans: status 5xx is an error, 499 is cancelled.")
    ] = True,
    suggest: Annotated[bool, typer.Option(
        "--suggest", help="Print a ready-to-run map command for the store's span trees, with the evidence "
        "for each rule; saves nothing.")] = False,
    reset: Annotated[bool, typer.Option("--reset", help="Remove the store's mapping and rebuild its requests.")
                     ] = False,
) -> None:
    """Declare the request and stage spans of a store's traces after the fact: no re-ingest, no code change.

    The mapping is saved in the store and applied by every reader (report, sql, watch, cost, the
    dashboard); the materialized requests of every hour are rebuilt with it. With no rule it shows the
    saved mapping; a new mapping replaces the saved one. Expressions: docs/convention.md#map.
    """
    from analysis.engine.materialize import materialize
    from analysis.mapping import rules as R
    from tracing.store import require_store

    target = store_path(store)
    shape = tuple((k, v) for k, v in (("tenant", tenant), ("model", model), ("model_version", model_version),
                                      ("input_tokens", input_tokens), ("output_tokens", output_tokens)) if v)
    has_rule = request is not None or bool(stage) or bool(shape) or bool(outcome) or not http_outcome
    if sum((has_rule, suggest, reset)) > 1:
        fail("give rules, --suggest or --reset, one at a time")
    with errors_as_messages():
        require_store(target)
        if suggest:
            _suggest(target)
            return
        if reset:
            removed = R.reset(target)
            t0 = time.perf_counter()
            hours = materialize(target)
            console.print(("mapping removed" if removed else "no mapping to remove")
                          + f"; rebuilt the requests of {len(hours)} hour(s) in {time.perf_counter() - t0:.1f} s",
                          highlight=False)
            return
        if not has_rule:
            saved = R.load(target)
            if saved is None:
                console.print(f"no mapping in {target}; `tailscope map --suggest --store {target}` proposes one",
                              highlight=False, soft_wrap=True)
            else:
                console.print(saved.command(str(target)), highlight=False, soft_wrap=True, markup=False)
            return
        try:
            mapping = R.Mapping(request=request, stages=_pairs(stage or [], "--stage"), shape=shape,
                                outcomes=_pairs(outcome or [], "--outcome"), http_outcome=http_outcome)
        except R.MappingError as exc:
            fail(str(exc))
        t0 = time.perf_counter()
        path = R.save(target, mapping)
        hours = materialize(target)
        elapsed = time.perf_counter() - t0
    console.print(f"mapping saved in {path}; rebuilt the requests of {len(hours)} hour(s) in {elapsed:.1f} s",
                  highlight=False, soft_wrap=True)
    _counts(target, mapping)


def _counts(store: Path, mapping: object) -> None:
    """What the mapping finds: requests, and per stage rule the requests where that stage holds time."""
    from analysis.engine.connect import connect
    from analysis.mapping.rules import Mapping

    assert isinstance(mapping, Mapping)
    con = connect(store)
    try:
        n = (con.execute("SELECT count(*) FROM requests").fetchone() or (0,))[0]
        line = f"{n:,} request(s)"
        if mapping.stages:
            cols = ", ".join(f"count(*) FILTER (WHERE {s}_ns > 0)" for s, _ in mapping.stages)
            got = con.execute(f"SELECT {cols} FROM requests").fetchone() or ()
            line += "; with time in " + ", ".join(f"{s} {k:,}" for (s, _), k in zip(mapping.stages, got, strict=True))
    finally:
        con.close()
    console.print(line, highlight=False, soft_wrap=True)
    if n == 0 and mapping.request is not None:
        err_console.print("[yellow]the request rule matched no span: check it with "
                          f"`tailscope sql \"SELECT SpanName, count(*) FROM spans GROUP BY 1\" --store {store}`[/]",
                          highlight=False, soft_wrap=True)


def _suggest(store: Path) -> None:
    import duckdb

    from analysis.engine.views import files_source
    from analysis.mapping.suggest import suggest
    from tracing.store import segment_files

    files = [str(f) for f in segment_files(store)]
    if not files:
        fail(f"{store} holds no span: ingest or collect traces first")
    con = duckdb.connect(":memory:")
    try:
        con.execute("SET enable_progress_bar = false")
        found = suggest(con, files_source(files))
    finally:
        con.close()
    if found.mapping is None:
        fail(f"no mapping to suggest: {found.why_none}")
    console.print(found.mapping.command(str(store)), highlight=False, soft_wrap=True, markup=False)
    for line in found.evidence:
        console.print(f"  # {line}", highlight=False, soft_wrap=True, markup=False)
    for line in found.left_out:
        console.print(f"  # left out {line}", highlight=False, soft_wrap=True, markup=False)


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("map")(map_command)
