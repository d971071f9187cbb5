"""How many spans were recognised as requests, and when none, why and what to add.

`ingest`, `collect` (its console line) and `report` all say it the same way: a trace that
does not follow the convention is stored, but nothing shows up as a request, and the user
must learn that at once rather than from blank tables (docs/convention.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tracing import schema as S

if TYPE_CHECKING:
    import pyarrow as pa

#: Where the convention is described (relative to the repository, as the docs link it).
DOCS = "docs/convention.md"

#: What an engine leaves out of its traces, so the report can say what its requests cannot show.
ENGINE_GAPS: Mapping[str, str] = {
    "vllm": "vLLM emits no span for an aborted request and sets no status or finish reason: "
            "its requests all read ok and aborts are missing",
    "triton": "Triton sets no span status: failed requests read ok",
    "tgi": "TGI records no first-token time: TTFT is the end of the first infer span",
    "sglang": "",
}

NO_REQUEST_WHY = (
    "no span carries tailscope.request, gen_ai.operation.name (on a SERVER or INTERNAL span) or an "
    "engine's request span with the engine's own evidence (its scope, service, attribute set or span tree: "
    "vLLM, SGLang, TGI, Triton)"
)
NO_REQUEST_FIX = (
    "fix without a code change: `tailscope map --suggest --store {store}` prints the `tailscope map` command "
    "that declares the request and stage spans of these traces; or set tailscope.request=true on the span "
    f"that is one inference request (or gen_ai.operation.name); see {DOCS}"
)


@dataclass
class Recognition:
    """Spans seen and requests recognised among them, per engine."""

    spans: int = 0
    requests: int = 0
    engines: dict[str, int] = field(default_factory=dict)
    #: engine -> why its mapper claimed the spans (`tailscope.engine.evidence`) -> request spans
    evidence: dict[str, dict[str, int]] = field(default_factory=dict)

    def add(self, other: Recognition) -> None:
        """Count `other` in too."""
        self.spans += other.spans
        self.requests += other.requests
        for name, n in other.engines.items():
            self.engines[name] = self.engines.get(name, 0) + n
        for name, whys in other.evidence.items():
            mine = self.evidence.setdefault(name, {})
            for why, n in whys.items():
                mine[why] = mine.get(why, 0) + n

    def summary(self) -> str:
        """'12 request(s) recognised among 340 span(s) (vllm 12 by scope vllm.llm_engine)'."""
        def one(name: str, n: int) -> str:
            whys = sorted(self.evidence.get(name, {}).items(), key=lambda kv: (-kv[1], kv[0]))
            if not whys:
                return f"{name} {n:,}"
            if len(whys) == 1:
                return f"{name} {n:,} by {whys[0][0]}"
            return f"{name} {n:,} by " + ", ".join(f"{why} ({k:,})" for why, k in whys)

        by = "; ".join(one(k, v) for k, v in sorted(self.engines.items()))
        return f"{self.requests:,} request(s) recognised among {self.spans:,} span(s)" + (f" ({by})" if by else "")

    def problem(self, store: str = "DIR") -> str | None:
        """The why-and-fix lines when spans arrived but none is a request, else None."""
        if self.spans == 0 or self.requests > 0:
            return None
        return f"no span was recognised as a request: {NO_REQUEST_WHY}.\n{NO_REQUEST_FIX.format(store=store)}"


def recognise(table: pa.Table) -> Recognition:
    """Count the request spans of a promoted (and engine-normalized) table, by `tailscope.engine`."""
    import pyarrow as pa  # here, not at the top: `tailscope report` reads the counts without pyarrow.compute
    import pyarrow.compute as pc

    if table.num_rows == 0:
        return Recognition()
    is_req = pc.fill_null(table.column("IsRequest"), False)
    n_requests = int(pc.sum(is_req).as_py() or 0)
    engines: dict[str, int] = {}
    evidence: dict[str, dict[str, int]] = {}
    if n_requests:  # only the attribute column is filtered: the receiver runs this once per group commit
        attrs = table.column("SpanAttributes").filter(is_req)
        names = pc.fill_null(pc.map_lookup(attrs, pa.scalar(S.ATTR_ENGINE), "first"), "")
        whys = pc.fill_null(pc.map_lookup(attrs, pa.scalar(S.ATTR_ENGINE_EVIDENCE), "first"), "")
        for item in pc.value_counts(pc.binary_join_element_wise(names, whys, "\x1f")).to_pylist():
            name, _, why = str(item["values"]).partition("\x1f")
            if name:
                engines[name] = engines.get(name, 0) + int(item["counts"])
                if why:
                    evidence.setdefault(name, {})[why] = int(item["counts"])
    return Recognition(table.num_rows, n_requests, engines, evidence)


def gaps(engines: Mapping[str, int]) -> list[str]:
    """What the engines present in the data do not record, one sentence each."""
    return [f"{name}: {ENGINE_GAPS[name]}" for name in sorted(engines) if ENGINE_GAPS.get(name)]


__all__ = ["DOCS", "ENGINE_GAPS", "Recognition", "gaps", "recognise"]
