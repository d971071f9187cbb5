"""The incident catalogue: tail-latency incidents injectable into a fleet run, each with ground truth.

Each incident perturbs a copy of the fleet configuration during a window of the run
and states what a correct diagnosis says: the window, the stage whose critical-path
time grew, and the dimension value that singles out the affected requests. `accept`
lists every (dimension, value) that identifies the same requests in the report's
vocabulary (the new replica *is* the cold start; a tenant's very long prompts are also
the only requests in the top input-token buckets), so a test can check the report's
first dimension against it without guessing.

Every incident touches a few percent of the requests of its window, hard: p99 rises
a lot while p50 stays within a few percent, as in real incidents.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from sample_traces.fleet import (
    NS,
    PREFIX_HIT_SHARE,
    START_NS,
    AdapterSwap,
    Burst,
    CacheFlush,
    FleetConfig,
    NetworkFault,
    Preemption,
    ReplicaSpec,
    ShapeShift,
    SimRequest,
    Throttle,
    default_config,
    simulate,
)
from sample_traces.quantile import quantile


@dataclass(frozen=True, slots=True)
class Accept:
    """One acceptable answer: a dimension and its value, or a numeric bucket starting at or above `lo_min`."""

    dimension: str
    value: str | None = None
    lo_min: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON form written to truth files."""
        out: dict[str, Any] = {"dimension": self.dimension}
        if self.value is not None:
            out["value"] = self.value
        if self.lo_min is not None:
            out["lo_min"] = self.lo_min
        return out


@dataclass(frozen=True, slots=True)
class Incident:
    """One catalogue entry: how to inject it (relative to the run) and what a diagnosis must name."""

    name: str
    title: str
    description: str
    stage: str | None
    dimension: str | None
    value: str | None
    #: Perturb the config; gets the config and the injected window [start_s, end_s).
    inject: Callable[[FleetConfig, float, float], FleetConfig]
    accept: tuple[Accept, ...] = ()
    #: The affected window, given the injected one (a cold start lasts as long as its load).
    affected_window: Callable[[float, float], tuple[float, float]] | None = None
    #: The latency whose spike it is (`report --metric`): a prefill-only incident shows in the time to first token.
    metric: str = "e2e"


def _add(items: tuple[Any, ...], item: Any) -> tuple[Any, ...]:
    return (*items, item)


LONG_PROMPT_TENANT = "wayne"
LONG_OUTPUT_TENANT = "tyrell"
SLOW_CLIENT_TENANT = "tyrell"
BURST_TENANT = "cyberdyne"
SLOW_REPLICA = "replica-07"
NEW_REPLICA = "replica-32"
SLOW_ZONE = "us-east-1c"
#: The node whose network card flaps.
SLOW_NODE = "us-east-1b-node-3"
CANARY_VERSION = "v2"
MODEL_LOAD_S = 90.0
#: Share of traffic the gateway sends to the canary.
CANARY_SHARE = 0.03


def _slow_replica(cfg: FleetConfig, t0: float, t1: float) -> FleetConfig:
    return replace(cfg, throttles=_add(cfg.throttles, Throttle(SLOW_REPLICA, t0, t1, factor=6.0)))


def _cold_start(cfg: FleetConfig, t0: float, t1: float) -> FleetConfig:
    spec = ReplicaSpec(NEW_REPLICA, zone="us-east-1a", joins_s=t0, load_s=MODEL_LOAD_S)
    return replace(cfg, replicas=_add(cfg.replicas, spec))


def _long_prompts(cfg: FleetConfig, t0: float, t1: float) -> FleetConfig:
    shift = ShapeShift(LONG_PROMPT_TENANT, t0, t1, input_median=96_000, input_sigma=0.15, max_input=126_000)
    return replace(cfg, shifts=_add(cfg.shifts, shift))


def _long_outputs(cfg: FleetConfig, t0: float, t1: float) -> FleetConfig:
    shift = ShapeShift(LONG_OUTPUT_TENANT, t0, t1, output_median=1_600, output_sigma=0.3, max_output=4_096)
    return replace(cfg, shifts=_add(cfg.shifts, shift))


def _burst(cfg: FleetConfig, t0: float, t1: float) -> FleetConfig:
    every = 60.0
    burst = Burst(BURST_TENANT, t0, count=12, spread_s=2.0, repeat_every_s=every,
                  repeats=max(1, int((t1 - t0) // every)))
    return replace(cfg, bursts=_add(cfg.bursts, burst))


def _canary(cfg: FleetConfig, t0: float, t1: float) -> FleetConfig:
    stable = sum(r.weight for r in cfg.replicas if r.joins_s <= t0 < r.leaves_s)
    weight = stable * CANARY_SHARE / (1 - CANARY_SHARE) / 2
    canaries = tuple(
        ReplicaSpec(f"canary-{i:02d}", zone=zone, version=CANARY_VERSION, joins_s=t0, leaves_s=t1,
                    weight=weight, decode_factor=6.0)
        for i, zone in enumerate(("us-east-1a", "us-east-1b"))
    )
    return replace(cfg, replicas=cfg.replicas + canaries)


def _slow_clients(cfg: FleetConfig, t0: float, t1: float) -> FleetConfig:
    shift = ShapeShift(SLOW_CLIENT_TENANT, t0, t1, client_tps=(3.0, 8.0))
    return replace(cfg, shifts=_add(cfg.shifts, shift))


def _zone_network(cfg: FleetConfig, t0: float, t1: float) -> FleetConfig:
    fault = NetworkFault(SLOW_ZONE, t0, t1, probability=0.5, extra_s=(10.0, 40.0))
    return replace(cfg, network_faults=_add(cfg.network_faults, fault))


#: The priority class the scheduler starts preempting.
PREEMPTED_PRIORITY = "batch"


def _preempted(cfg: FleetConfig, t0: float, t1: float) -> FleetConfig:
    return replace(cfg, preemptions=(*cfg.preemptions, Preemption(PREEMPTED_PRIORITY, t0, t1, factor=6.0)))


def _node_replicas() -> tuple[str, ...]:
    return tuple(r.name for r in default_config().replicas if r.node == SLOW_NODE)


def _node_nic(cfg: FleetConfig, t0: float, t1: float) -> FleetConfig:
    fault = NetworkFault("", t0, t1, probability=0.5, extra_s=(10.0, 40.0), node=SLOW_NODE)
    return replace(cfg, network_faults=_add(cfg.network_faults, fault))


#: Share of the prefix-cache hits the flush turns into misses (a few percent of traffic: a tail spike, not a
#: slowdown of every request), and how much longer their prefill takes (s).
FLUSH_MISS_SHARE = 0.04
FLUSH_EXTRA_S = (3.0, 10.0)


def _cache_flush(cfg: FleetConfig, t0: float, t1: float) -> FleetConfig:
    flush = CacheFlush(t0, t1, miss_share=FLUSH_MISS_SHARE, extra_s=FLUSH_EXTRA_S)
    return replace(cfg, cache_flushes=_add(cfg.cache_flushes, flush))


#: The LoRA adapter that thrashes, the share of its requests that find it evicted, and how much longer their decode
#: steps take.
SWAPPED_ADAPTER = "legal-summary"
SWAP_SHARE = 0.3
SWAP_DECODE_FACTOR = 8.0


def _adapter_swap(cfg: FleetConfig, t0: float, t1: float) -> FleetConfig:
    swap = AdapterSwap(SWAPPED_ADAPTER, t0, t1, share=SWAP_SHARE, factor=SWAP_DECODE_FACTOR)
    return replace(cfg, adapter_swaps=_add(cfg.adapter_swaps, swap))


CATALOGUE: tuple[Incident, ...] = (
    Incident("clean", "Clean run", "No incident: the fleet as it runs every day.", None, None, None,
             lambda cfg, t0, t1: cfg),
    Incident("slow_replica", "Slow replica (throttled GPU)",
             f"{SLOW_REPLICA}'s GPU is stuck at its lowest clock (a power-brake slowdown): prefill and decode "
             "run 6x slower.",
             "decode", "replica", SLOW_REPLICA, _slow_replica, (Accept("replica", SLOW_REPLICA),)),
    Incident("cold_start", "Cold starts after a scale-up",
             f"The autoscaler adds {NEW_REPLICA}; the gateway routes to it before the model has loaded, "
             f"so its first requests wait {MODEL_LOAD_S:.0f} s for weights.",
             "model_load", "replica", NEW_REPLICA, _cold_start, (Accept("replica", NEW_REPLICA),),
             affected_window=lambda t0, t1: (t0, t0 + MODEL_LOAD_S)),
    Incident("tenant_long_prompts", "Tenant shape shift: very long prompts",
             f"Tenant {LONG_PROMPT_TENANT} starts sending whole documents: ~96k-token prompts; prefill grows.",
             "prefill", "tenant", LONG_PROMPT_TENANT, _long_prompts,
             (Accept("tenant", LONG_PROMPT_TENANT), Accept("input_tokens", lo_min=16_384))),
    Incident("tenant_long_outputs", "Tenant shape shift: very long outputs",
             f"Tenant {LONG_OUTPUT_TENANT} raises max_tokens and asks for ~1.6k-token answers; decode grows.",
             "decode", "tenant", LONG_OUTPUT_TENANT, _long_outputs,
             (Accept("tenant", LONG_OUTPUT_TENANT), Accept("output_tokens", lo_min=2_048))),
    Incident("queue_backlog", "Queue backlog from a traffic burst",
             f"Tenant {BURST_TENANT}'s batch job fires 12 requests at once every minute; its concurrency "
             "limit (2) queues them at the gateway.",
             "queue_wait", "tenant", BURST_TENANT, _burst, (Accept("tenant", BURST_TENANT),)),
    Incident("canary_slow_version", "Slow model version on a canary",
             f"Model version {CANARY_VERSION} goes to a canary ({CANARY_SHARE:.0%} of traffic, two replicas) "
             "with a decode regression (a kernel fallback): 6x slower steps.",
             "decode", "model_version", CANARY_VERSION, _canary, (Accept("model_version", CANARY_VERSION),)),
    Incident("slow_clients", "Slow clients stretching streaming",
             f"Tenant {SLOW_CLIENT_TENANT} ships a client that reads the stream at 3-8 tokens/s; the server's "
             "stream stays open long after decode.",
             "streaming", "tenant", SLOW_CLIENT_TENANT, _slow_clients, (Accept("tenant", SLOW_CLIENT_TENANT),)),
    Incident("zone_network", "Network hop adding latency on one zone",
             f"The gateway's hop into {SLOW_ZONE} drops packets: half its requests wait 10-40 s on retransmits.",
             "network", "cloud.availability_zone", SLOW_ZONE, _zone_network,
             (Accept("cloud.availability_zone", SLOW_ZONE),)),
    Incident("node_nic_flapping", "A flapping network card on one Kubernetes node",
             f"The network card of node {SLOW_NODE} flaps: half the requests the gateway sends to its "
             f"{len(_node_replicas())} replicas wait 10-40 s on retransmits.",
             "network", "k8s.node.name", SLOW_NODE, _node_nic, (Accept("k8s.node.name", SLOW_NODE),)),
    Incident("priority_preemption", "A priority class preempted",
             f"A scheduler change starts preempting {PREEMPTED_PRIORITY!r}-priority requests under load (4 % of "
             "traffic): each is resumed and recomputed, so its decode takes 6x the steps.",
             "decode", "request.priority", PREEMPTED_PRIORITY, _preempted,
             (Accept("request.priority", PREEMPTED_PRIORITY),)),
    Incident("prefix_cache_flush", "A prefix-cache miss storm after a cache flush",
             f"A config push restarts the engines' prefix cache: {FLUSH_MISS_SHARE:.0%} of the requests whose "
             f"prompt prefix was cached ({PREFIX_HIT_SHARE:.0%} of traffic) miss it, read 0 cached tokens and "
             f"recompute it behind every replica's recompute: their prefill takes {FLUSH_EXTRA_S[0]:.0f}-"
             f"{FLUSH_EXTRA_S[1]:.0f} s longer.",
             "prefill", "gen_ai.usage.cache_read.input_tokens", "0-0", _cache_flush,
             (Accept("gen_ai.usage.cache_read.input_tokens", "0-0"),), metric="ttft"),
    Incident("lora_adapter_swap", "A LoRA adapter thrashing in and out of GPU memory",
             f"A memory limit cut leaves room for two of three LoRA adapters: {SWAPPED_ADAPTER!r} (10 % of "
             f"traffic) is evicted between steps; {SWAP_SHARE:.0%} of its requests wait for it to be loaded back "
             f"from host memory, so each of their decode steps takes {SWAP_DECODE_FACTOR:.0f}x as long.",
             "decode", "gen_ai.request.lora_adapter", SWAPPED_ADAPTER, _adapter_swap,
             (Accept("gen_ai.request.lora_adapter", SWAPPED_ADAPTER),)),
)

BY_NAME: dict[str, Incident] = {i.name: i for i in CATALOGUE}

#: Incident window as shares of the run: [0.5, 0.8) of a 600 s run is minutes 5 to 8.
WINDOW_SHARE = (0.5, 0.8)


#: The aftermath's step: after the injection the truth window grows by whole windows of this length (s).
AFTERMATH_WINDOW_S = 60.0
#: A window after the injection is still the incident's while the incident run's p99 of the incident's latency, over
#: the requests arriving in it, exceeds the clean run's (same seed, same requests) by more than this share: the rise
#: by which the analysis calls a window's p99 a spike (analysis.stats.spikes.MIN_RISE; this floor cannot import it,
#: tests/sample_traces/test_aftermath.py checks they agree).
AFTERMATH_RISE = 0.2


@dataclass(frozen=True, slots=True)
class Scenario:
    """One simulated run of one incident: its requests and its ground truth.

    `window_s` is the injected window (the affected one, for a cold start); `clean` is the same run without the
    incident (`clean_run`), whose comparison gives the truth its aftermath (`aftermath`).
    """

    incident: Incident
    seed: int
    config: FleetConfig
    requests: list[SimRequest]
    window_s: tuple[float, float]
    clean_config: FleetConfig | None = None

    def truth(self, clean: Sequence[SimRequest] | None = None) -> dict[str, Any]:
        """Ground truth as JSON: window (s and ns and ISO; the injection plus its aftermath), the injected window and
        the aftermath's windows, stage, dimension, value, accept, effect. `clean`: the run without the incident (by
        default simulated from `clean_config`, once per process)."""
        inc = self.incident
        out: dict[str, Any] = {
            "scenario": inc.name,
            "title": inc.title,
            "description": inc.description,
            "seed": self.seed,
            "duration_s": self.config.duration_s,
            "requests": len(self.requests),
            "spike": inc.stage is not None,
        }
        if inc.stage is not None:
            if clean is None:
                if self.clean_config is None:
                    raise ValueError(f"{inc.name}: the truth needs the run without the incident (clean)")
                clean = clean_run(self.clean_config, self.seed)
            t0, t1 = self.window_s
            after = aftermath(inc, self.config, self.requests, clean, t1)
            end = t1 + len(after["windows"]) * AFTERMATH_WINDOW_S
            out["window"] = _window(t0, end)
            out["injected"] = _window(t0, t1)
            out["aftermath"] = after
            out.update(stage=inc.stage, dimension=inc.dimension, value=inc.value,
                       accept=[a.to_json() for a in inc.accept])
            if inc.metric != "e2e":  # (the e2e truth files predate the key)
                out["metric"] = inc.metric
            out["effect"] = effect(self.requests, clean, t0, end, inc.metric)
        return out


def _window(t0: float, t1: float) -> dict[str, Any]:
    """[t0, t1) in seconds from the run's start, epoch ns and ISO."""
    return {"start_s": t0, "end_s": t1, "start_ns": START_NS + round(t0 * NS), "end_ns": START_NS + round(t1 * NS),
            "start": _iso(t0), "end": _iso(t1)}


def _iso(t_s: float) -> str:
    return datetime.fromtimestamp(START_NS / NS + t_s, UTC).isoformat().replace("+00:00", "Z")


def _latency_ms(r: SimRequest, metric: str) -> float | None:
    """The request's `metric` in ms: e2e, or ttft (None when it got no first token)."""
    if metric == "ttft":
        return (r.first_token_s - r.arrival_s) * 1000 if r.first_token_s < r.end_s else None
    return r.e2e_s * 1000


def _latencies_ms(reqs: Sequence[SimRequest], t0: float, t1: float, metric: str) -> list[float]:
    """The `metric` in ms of the requests arriving in [t0, t1) (for ttft, of those that got a first token)."""
    return [v for r in reqs if t0 <= r.arrival_s < t1 and (v := _latency_ms(r, metric)) is not None]


#: Each incident dimension's value of a simulated request, in the report's vocabulary (the prefix-cache read as its
#: bucket: `0-0` is a miss), given the replica -> node map.
_DIMENSION_OF: dict[str, Callable[[SimRequest, dict[str, str]], str]] = {
    "replica": lambda r, _: r.replica,
    "tenant": lambda r, _: r.tenant,
    "model_version": lambda r, _: r.version,
    "cloud.availability_zone": lambda r, _: r.zone,
    "k8s.node.name": lambda r, nodes: nodes.get(r.replica, ""),
    "request.priority": lambda r, _: r.priority,
    "gen_ai.request.lora_adapter": lambda r, _: r.lora_adapter,
    "gen_ai.usage.cache_read.input_tokens": lambda r, _: "0-0" if r.cached_tokens == 0 else "hit",
}


def named_by(inc: Incident, cfg: FleetConfig) -> Callable[[SimRequest], bool]:
    """Whether a request of a run of `cfg` is one the incident names (its dimension has the incident's value)."""
    nodes = {r.name: r.node for r in cfg.replicas}
    of = _DIMENSION_OF[inc.dimension or ""]
    return lambda r: of(r, nodes) == inc.value


def aftermath(inc: Incident, cfg: FleetConfig, reqs: Sequence[SimRequest], clean: Sequence[SimRequest],
              end_s: float) -> dict[str, Any]:
    """The incident's measured aftermath in the run `reqs` of `cfg`: the AFTERMATH_WINDOW_S windows from `end_s` (the
    injection's end) on, each the incident's while the requests it names alone lift the window's p99 of its metric
    by more than AFTERMATH_RISE over the clean run's: the p99 of the window's requests, each the incident's named
    one with its latency in the incident run, every other with its latency in the clean run (its twin: the same
    arrival, the same draws). Up to the first window that does not (or the run's last whole window).
    `windows`: the two p99s (ms) of each window that did; `stopped`: those of the first that did not (None at the
    run's end). Knock-on effects on other requests (a tenant's backlog behind its preempted requests) are not the
    incident's: the report names the incident's requests, and its bounds are theirs."""
    named = named_by(inc, cfg)
    clean_by_arrival = {r.arrival_s: r for r in clean}
    windows: list[dict[str, float]] = []
    stopped: dict[str, float] | None = None
    a = end_s
    while a + AFTERMATH_WINDOW_S <= cfg.duration_s:
        b = a + AFTERMATH_WINDOW_S
        mixed = []
        for r in reqs:
            if a <= r.arrival_s < b:
                twin = r if named(r) else clean_by_arrival.get(r.arrival_s)
                v = None if twin is None else _latency_ms(twin, inc.metric)
                if v is not None:
                    mixed.append(v)
        ours, theirs = quantile(mixed, 0.99), quantile(_latencies_ms(clean, a, b, inc.metric), 0.99)
        p99 = {"incident_p99_ms": round(ours, 1), "clean_p99_ms": round(theirs, 1)}
        if not ours > (1 + AFTERMATH_RISE) * theirs:
            stopped = p99
            break
        windows.append(p99)
        a = b
    return {"window_s": AFTERMATH_WINDOW_S, "rise": AFTERMATH_RISE, "windows": windows, "stopped": stopped}


def effect(reqs: Sequence[SimRequest], clean: Sequence[SimRequest] | None, t0: float, t1: float,
           metric: str = "e2e") -> dict[str, Any]:
    """p50 and p99 (ms) of the `metric` (e2e, or ttft: of the requests that got a first token) of the requests
    arriving in [t0, t1), with the incident and, if given, without."""

    def stats(rs: Sequence[SimRequest]) -> dict[str, float]:
        ms = _latencies_ms(rs, t0, t1, metric)
        return {"requests": len(ms), "p50_ms": round(quantile(ms, 0.5), 1), "p99_ms": round(quantile(ms, 0.99), 1)}

    out: dict[str, Any] = {"incident": stats(reqs)}
    if clean is not None:
        out["clean"] = stats(clean)
    return out


@lru_cache(maxsize=2)
def _clean_cached(cfg: FleetConfig, seed: int) -> tuple[SimRequest, ...]:
    return tuple(simulate(cfg, seed))


def clean_run(cfg: FleetConfig, seed: int) -> list[SimRequest]:
    """The run of `cfg` (a configuration without the incident) on `seed`, simulated once per process for the last
    two asked (a fresh list; the requests are shared, read them only)."""
    return list(_clean_cached(cfg, seed))


def run(name: str, seed: int = 1, duration_s: float = 600.0, rate: float = 10.0,
        base: FleetConfig | None = None) -> Scenario:
    """Simulate one catalogue entry: the default fleet (or `base`) with the incident injected."""
    inc = BY_NAME[name]
    cfg = base if base is not None else default_config(duration_s=duration_s, rate=rate)
    t0, t1 = WINDOW_SHARE[0] * cfg.duration_s, WINDOW_SHARE[1] * cfg.duration_s
    injected = inc.inject(cfg, t0, t1)
    window = inc.affected_window(t0, t1) if inc.affected_window else (t0, t1)
    return Scenario(inc, seed, injected, simulate(injected, seed), window, cfg)


def write_truth(path: Path, truth: dict[str, Any]) -> Path:
    """Write a truth file (sorted keys, stable formatting) and return its path."""
    path.write_text(json.dumps(truth, indent=2, sort_keys=True) + "\n")
    return path


#: The demo's 30-minute timeline at 8 requests/s: two incidents with quiet time around them.
DEMO_PLAN: tuple[tuple[str, float, float], ...] = (
    ("slow_replica", 420.0, 600.0),
    ("slow_clients", 1200.0, 1380.0),
)
DEMO_DURATION_S = 1800.0
DEMO_RATE = 8.0


@dataclass(frozen=True, slots=True)
class Timeline:
    """One run with several incidents at given times, and the truth of each."""

    seed: int
    config: FleetConfig
    requests: list[SimRequest]
    incidents: tuple[tuple[Incident, tuple[float, float]], ...]
    clean_config: FleetConfig | None = None

    def truth(self, clean: Sequence[SimRequest] | None = None) -> dict[str, Any]:
        """Ground truth of every incident of the run, in time order (each with its aftermath against `clean`, by
        default the run of `clean_config`)."""
        out = []
        for inc, (t0, t1) in self.incidents:
            single = Scenario(inc, self.seed, self.config, self.requests, (t0, t1), self.clean_config).truth(clean)
            for key in ("seed", "duration_s", "requests"):
                single.pop(key)
            out.append(single)
        return {"scenario": "timeline", "seed": self.seed, "duration_s": self.config.duration_s,
                "requests": len(self.requests), "incidents": out}


def run_timeline(plan: Sequence[tuple[str, float, float]] = DEMO_PLAN, seed: int = 1,
                 duration_s: float = DEMO_DURATION_S, rate: float = DEMO_RATE) -> Timeline:
    """Simulate the default fleet with each (incident, start_s, end_s) of `plan` injected."""
    cfg = clean = default_config(duration_s=duration_s, rate=rate)
    placed = []
    for name, t0, t1 in plan:
        inc = BY_NAME[name]
        cfg = inc.inject(cfg, t0, t1)
        placed.append((inc, inc.affected_window(t0, t1) if inc.affected_window else (t0, t1)))
    return Timeline(seed, cfg, simulate(cfg, seed), tuple(placed), clean)
