"""The `tailscope report --json` contract (version 1) as types: what docs/methods.md documents, key by key.

`build_report` returns a `Report`. A key marked NotRequired appears only in some reports: the
explanation keys of a spike item when its explanation ran, `detected` on `explain_window`'s item.
tests/analysis/test_report_contract.py checks real reports against these types and every key here
against the table in docs/methods.md, so code, types and docs change together. Version 1 only grows:
a new key is an addition, never a change of meaning.
"""

from typing import NotRequired, TypedDict


class Condition(TypedDict):
    """One part of a dimension value: a single dimension's value (lo / hi for a token bucket)."""

    dimension: str
    value: str
    lo: int | None
    hi: int | None
    attribute: str | None
    source: str


class Level(TypedDict):
    """A value nested with the first dimension's (a finer or coarser level of a hierarchy learned from the data)."""

    dimension: str
    value: str
    attribute: str | None
    source: str
    explained: float | None
    support: int


class Dimension(TypedDict):
    """A candidate explanation of a spike: a value (or pair of values) over-represented in the tail."""

    dimension: str
    value: str
    lo: int | None
    hi: int | None
    score: float
    p99_without_ms: float | None
    explained: float | None
    support: int
    tail_share: float
    baseline_share: float
    baseline_p99_without_ms: float | None
    p_value: float
    conditions: list[Condition]
    support_weighted: NotRequired[float]
    attribute: str | None
    source: str
    finer: NotRequired[list[Level]]
    coarser: NotRequired[list[Level]]
    folded_under: NotRequired[int]


class PairCut(TypedDict):
    """A pair of dimensions left out of a spike's family for its size (explain.MAX_PAIR_CELLS)."""

    dimension: str
    cells: int
    why: str


class StageShare(TypedDict):
    """A stage's share of the tail's growth against the baseline."""

    stage: str
    share: float
    tail_ms: float
    baseline_ms: float


class Shares(TypedDict):
    """A tenant's share in the spike and in the baseline."""

    spike: float
    baseline: float


class NoisyNeighbour(TypedDict):
    """A tenant whose burst of concurrency explains a queue-wait spike (docs/cost.md)."""

    tenant: str
    replicas: list[str]
    admitted_share: Shares
    gpu_share: Shares
    tail_share_own: float
    victims: list[str]
    sentence: str


class Spike(TypedDict):
    """One spike of a report, with its explanation."""

    start: str
    end: str
    requests: int
    p50_ms: float | None
    p99_ms: float | None
    baseline_p50_ms: float | None
    baseline_p99_ms: float | None
    excess_ms: float | None
    p_value: float | None
    windows: int
    stages: list[StageShare]
    dimensions: list[Dimension]
    exemplars: list[str]
    requests_weighted: float
    n_effective: float
    candidates_tested: NotRequired[int]
    pairs_cut: NotRequired[list[PairCut]]
    tail_requests: NotRequired[int]
    tail_requests_weighted: NotRequired[float]
    tail_effective: NotRequired[float | None]
    noisy_neighbour: NotRequired[NoisyNeighbour | None]
    errors: NotRequired[list[str]]
    detected: NotRequired[bool]


class Sampling(TypedDict):
    """How the analysed requests were sampled, and whether that biases the percentiles."""

    policy: str
    recorded: int
    unrecorded: int
    malformed: int
    tail_based: bool
    evidence: str | None
    p50_ms: float | None
    p99_ms: float | None
    unbiased_p50_ms: float | None
    unbiased_p99_ms: float | None
    bias: dict[str, float | None]


class AttributeConsidered(TypedDict):
    """An attribute kept as a candidate dimension."""

    attribute: str
    source: str
    kind: str
    values: int
    requests: int


class AttributeSkipped(TypedDict):
    """An attribute (or a built-in dimension a pattern left out) that is not a candidate, and why."""

    attribute: str | None
    source: str
    reason: str
    why: str
    dimension: NotRequired[str]


class Attributes(TypedDict):
    """What the explanation read of the attributes: considered, skipped and why, cut."""

    considered: list[AttributeConsidered]
    skipped: list[AttributeSkipped]
    cut: int
    max_attributes: int
    errors: list[str]


class Report(TypedDict):
    """`tailscope report --json`: the spikes of a metric's p99 in a range, each explained."""

    version: int
    metric: str
    window_s: int | float
    requests: int
    outcomes: dict[str, int]
    include_failures: bool
    since: str | None
    until: str | None
    percentile_convention: str
    values: int
    windows: int
    baseline_p50_ms: float | None
    baseline_p99_ms: float | None
    spikes: list[Spike]
    errors: list[str]
    sampled: bool
    requests_weighted: float
    outcomes_weighted: dict[str, float]
    values_weighted: float
    values_effective: float | None
    baseline_effective: float | None
    sampling: Sampling | None
    warnings: list[str]
    attributes: Attributes | None
