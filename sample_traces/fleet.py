"""A discrete-event simulator of an LLM serving fleet, in simulated time, deterministic from a seed.

The fleet: a gateway that tokenizes, enforces per-tenant concurrency limits and routes
each request at random (weighted, as kube-proxy or a canary split does) to one of many
replicas of an LLM server. Each replica does continuous batching: a fixed number of
batch slots, a FIFO admission queue in front of them, a prefill whose cost grows with the
input tokens (linear plus an attention term), then decode at one token per step where
the step time grows with the batch occupancy. Replicas that join on a scale-up load the
model first (requests routed to them wait in `model_load`). Clients read the stream at
their own speed, so a slow reader stretches `streaming` past the end of decode.
Input and output lengths are heavy tailed (log-normal, capped), and a small share of
requests fail (validation errors, engine crashes) or run past their tenant's deadline.

Every random draw a request needs is made when its arrival is generated, from one seeded
generator, so an incident changes only what it targets: the same seed with and without
an incident gives the same arrivals, shapes and routing draws.

Decode uses a per-replica token clock: every decoding request of a replica advances one
token per step, so a request finishes when the clock has advanced by its output tokens;
the clock's rate changes only when occupancy or speed changes. That keeps the cost per
event O(log slots), and tens of thousands of requests simulate in about a second.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

NS = 1_000_000_000
#: Simulated runs start here: 2025-11-20T14:00:00Z.
START_NS = 1_763_647_200_000_000_000


def sim_ns(t_s: float) -> int:
    """Epoch nanoseconds of a simulated instant `t_s` seconds after START_NS."""
    return START_NS + round(t_s * NS)

# --- configuration ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Tenant:
    """One API tenant: its share of traffic and the shape of its requests."""

    name: str
    weight: float
    input_median: float = 600.0
    input_sigma: float = 1.0
    output_median: float = 170.0
    output_sigma: float = 0.65
    max_input: int = 16_000
    max_output: int = 2_048
    stream_share: float = 0.85
    deadline_s: float = 300.0
    max_concurrency: int = 64
    #: Share of this tenant's clients that read the stream slower than it is generated.
    slow_reader_share: float = 0.1


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    """One replica: where it runs, what it serves, when it takes traffic, how fast it is."""

    name: str
    zone: str
    version: str = "v1"
    joins_s: float = 0.0
    leaves_s: float = math.inf
    #: Model load time when it joins (0: already warm).
    load_s: float = 0.0
    #: Routing weight relative to a normal replica.
    weight: float = 1.0
    #: Multiplier on decode step time (a slower model build).
    decode_factor: float = 1.0
    #: The Kubernetes node it runs on (resource `k8s.node.name`; "" for none).
    node: str = ""


@dataclass(frozen=True, slots=True)
class Throttle:
    """A replica computing `factor` times slower (prefill and decode) during [start_s, end_s)."""

    replica: str
    start_s: float
    end_s: float
    factor: float


@dataclass(frozen=True, slots=True)
class ShapeShift:
    """A tenant's requests arriving in [start_s, end_s) take another shape or client speed."""

    tenant: str
    start_s: float
    end_s: float
    input_median: float | None = None
    input_sigma: float | None = None
    max_input: int | None = None
    output_median: float | None = None
    output_sigma: float | None = None
    max_output: int | None = None
    #: Client read speed (tokens/s) range for every request of the tenant in the interval.
    client_tps: tuple[float, float] | None = None


@dataclass(frozen=True, slots=True)
class Burst:
    """`count` extra requests of `tenant` arriving within `spread_s` from `at_s`, repeated."""

    tenant: str
    at_s: float
    count: int
    spread_s: float = 2.0
    repeat_every_s: float = 0.0
    repeats: int = 1


@dataclass(frozen=True, slots=True)
class NetworkFault:
    """A lossy hop in front of `zone` (or of one node's replicas, when `node` is given): a share of requests wait on
    retransmits in [start_s, end_s)."""

    zone: str
    start_s: float
    end_s: float
    probability: float
    extra_s: tuple[float, float]
    node: str = ""


@dataclass(frozen=True, slots=True)
class Preemption:
    """Requests of `priority` starting generation in [start_s, end_s) are preempted and resumed by the scheduler:
    their decode takes `factor` times the steps (the recomputation after each preemption)."""

    priority: str
    start_s: float
    end_s: float
    factor: float


@dataclass(frozen=True, slots=True)
class CacheFlush:
    """The prefix cache flushed at `start_s`: of the requests arriving in [start_s, end_s) whose prompt prefix was
    cached, a share `miss_share` find it evicted (they read 0 cached tokens) and recompute it behind every other
    replica's recompute of the same prefixes: their prefill takes `extra_s` (a range) longer."""

    start_s: float
    end_s: float
    miss_share: float
    extra_s: tuple[float, float]


@dataclass(frozen=True, slots=True)
class AdapterSwap:
    """LoRA adapter `adapter` thrashing in [start_s, end_s): a share `share` of its requests starting generation then
    find it evicted by the others between steps (their fault draw decides) and wait for it to be loaded back from
    host memory: they take `factor` times as long per decode step."""

    adapter: str
    start_s: float
    end_s: float
    share: float
    factor: float


#: Request priority classes and their shares of traffic (request attribute `request.priority`).
PRIORITIES: tuple[tuple[str, float], ...] = (("interactive", 0.20), ("standard", 0.76), ("batch", 0.04))
#: LoRA adapters a share of requests asks for (request attribute `gen_ai.request.lora_adapter`), and that share.
LORA_ADAPTERS: tuple[str, ...] = ("sql-coder", "support-tone", "legal-summary")
LORA_SHARE = 0.3
#: Share of requests whose prompt prefix is in the prefix cache (attribute gen_ai.usage.cache_read.input_tokens).
PREFIX_HIT_SHARE = 0.6


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """The whole fleet and its traffic; incidents add perturbations to a copy of it."""

    duration_s: float = 600.0
    rate: float = 6.0
    replicas: tuple[ReplicaSpec, ...] = ()
    tenants: tuple[Tenant, ...] = ()
    slots: int = 32
    service: str = "llm-server"
    model: str = "llama-3.1-70b-instruct"
    # GPU cost model (seconds): prefill = a + in/b + (in/c)^2 ; decode step = d + e * occupancy
    prefill_fixed_s: float = 0.03
    prefill_tokens_per_s: float = 6_000.0
    prefill_quadratic_tokens: float = 36_000.0
    step_base_s: float = 0.020
    step_per_seq_s: float = 0.0006
    # gateway and client
    tokenize_tokens_per_s: float = 200_000.0
    hop_median_s: float = 0.0015
    forward_hop_s: float = 0.0004
    fast_reader_tps: tuple[float, float] = (150.0, 600.0)
    slow_reader_tps: tuple[float, float] = (22.0, 45.0)
    error_rate: float = 0.003
    throttles: tuple[Throttle, ...] = ()
    shifts: tuple[ShapeShift, ...] = ()
    bursts: tuple[Burst, ...] = ()
    network_faults: tuple[NetworkFault, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    cache_flushes: tuple[CacheFlush, ...] = ()
    adapter_swaps: tuple[AdapterSwap, ...] = ()


ZONES: tuple[str, ...] = ("us-east-1a", "us-east-1b", "us-east-1c")


#: Replicas per Kubernetes node (the nodes of a zone are filled in replica order).
REPLICAS_PER_NODE = 2


def default_replicas(count: int = 32, small_zone_replicas: int = 2) -> tuple[ReplicaSpec, ...]:
    """`count` warm replicas: `small_zone_replicas` in the small third zone, the rest split over two; each zone's
    replicas fill its nodes REPLICAS_PER_NODE at a time (node `<zone>-node-<k>`)."""
    specs = []
    big = count - small_zone_replicas
    in_zone: dict[str, int] = {}
    for i in range(count):
        zone = ZONES[2] if i >= big else ZONES[i % 2]
        k = in_zone.get(zone, 0)
        in_zone[zone] = k + 1
        specs.append(ReplicaSpec(name=f"replica-{i:02d}", zone=zone, node=f"{zone}-node-{k // REPLICAS_PER_NODE}"))
    return tuple(specs)


def default_tenants() -> tuple[Tenant, ...]:
    """Nine tenants with different shares and request shapes (chat, RAG, batch, agents)."""
    return (
        Tenant("acme", 0.28),
        Tenant("globex", 0.20, input_median=1_400, output_median=120, deadline_s=20.0),
        Tenant("initech", 0.15, output_median=220),
        Tenant("umbrella", 0.12, input_median=2_500, input_sigma=0.8, output_median=90),
        Tenant("hooli", 0.10, output_median=200, slow_reader_share=0.2),
        Tenant("stark", 0.06, input_median=900),
        Tenant("wayne", 0.03),
        Tenant("tyrell", 0.03, output_median=160),
        Tenant("cyberdyne", 0.025, input_median=3_000, output_median=150, stream_share=0.0,
               max_concurrency=2),
    )


def default_config(duration_s: float = 600.0, rate: float = 10.0) -> FleetConfig:
    """The standard fleet: 32 replicas of one model in three zones, nine tenants."""
    return FleetConfig(duration_s=duration_s, rate=rate, replicas=default_replicas(),
                       tenants=default_tenants())


# --- simulated requests -----------------------------------------------------------------


@dataclass(slots=True)
class SimRequest:
    """One simulated request: its shape, where it ran, and every stage boundary in seconds.

    Times are seconds from the run start; `None` means the stage did not happen. The
    request ends at `end_s` with `status` ok, error or timeout.
    """

    index: int
    tenant: str
    arrival_s: float
    input_tokens: int
    output_tokens: int
    streaming: bool
    client_tps: float
    route_u: float
    hop_s: float
    error_u: float
    error_frac: float
    deadline_s: float
    fault_u: float = 1.0
    fault_extra_u: float = 0.0
    #: request attributes drawn from their own stream (so adding them moved no other draw)
    priority: str = "standard"
    lora_adapter: str = ""
    cached_tokens: int = 0
    #: Seconds added to the prefill (a prefix the cache lost, recomputed).
    prefill_extra_s: float = 0.0
    replica: str = ""
    zone: str = ""
    version: str = ""
    hop_end_s: float = 0.0
    pre_end_s: float = 0.0
    routed_s: float = 0.0
    at_replica_s: float = 0.0
    load_end_s: float | None = None
    gen_start_s: float = 0.0
    first_token_s: float = 0.0
    decode_end_s: float = 0.0
    stream_end_s: float | None = None
    end_s: float = 0.0
    status: str = "ok"
    error_type: str = ""
    # simulation bookkeeping
    decode_target: float = 0.0

    @property
    def e2e_s(self) -> float:
        """End-to-end latency in seconds."""
        return self.end_s - self.arrival_s


@dataclass(slots=True)
class _Replica:
    spec: ReplicaSpec
    ready_s: float
    busy: int = 0
    queue: deque[SimRequest] = field(default_factory=deque)
    clock: float = 0.0
    clock_at: float = 0.0
    decoding: list[tuple[float, int, SimRequest]] = field(default_factory=list)
    speed: float = 1.0
    epoch: int = 0


# event kinds, in tie-break order at equal times
_ROUTES, _ARRIVE, _PRE_DONE, _AT_REPLICA, _READY, _SPEED, _PREFILL_DONE, _DECODE_CHECK = range(8)


def _lognormal(rng: random.Random, median: float, sigma: float) -> float:
    return median * math.exp(sigma * rng.gauss(0.0, 1.0))


class _Sim:
    def __init__(self, cfg: FleetConfig, seed: int) -> None:
        self.cfg = cfg
        self.rng = random.Random(seed)
        self.attr_rng = random.Random(f"attributes-{seed}")
        #: a burst's extra requests draw from their own stream, so they move no draw of the others
        self.burst_rng = random.Random(f"bursts-{seed}")
        self.events: list[tuple[float, int, int, Any]] = []
        self.seq = 0
        self.replicas = {spec.name: _Replica(spec, ready_s=spec.joins_s + spec.load_s) for spec in cfg.replicas}
        self.tenants = {t.name: t for t in cfg.tenants}
        self.tenant_busy: dict[str, int] = dict.fromkeys(self.tenants, 0)
        self.tenant_queue: dict[str, deque[SimRequest]] = {t: deque() for t in self.tenants}
        self.route_names: list[str] = []
        self.route_cum: list[float] = []
        self.done: list[SimRequest] = []

    # -- events
    def push(self, t: float, kind: int, payload: Any) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, kind, self.seq, payload))

    # -- arrivals, drawn up front
    def arrivals(self) -> list[SimRequest]:
        cfg, rng = self.cfg, self.rng
        names = [tc.name for tc in cfg.tenants]
        cum: list[float] = []
        acc = 0.0
        for tenant_cfg in cfg.tenants:
            acc += tenant_cfg.weight
            cum.append(acc)
        times: list[tuple[float, str | None]] = []
        t = 0.0
        while True:
            t += rng.expovariate(cfg.rate)
            if t >= cfg.duration_s:
                break
            times.append((t, None))
        for b in cfg.bursts:
            for k in range(b.repeats):
                base = b.at_s + k * b.repeat_every_s
                times.extend((base + i * b.spread_s / max(1, b.count), b.tenant) for i in range(b.count))
        times.sort(key=lambda x: x[0])
        out = []
        main = rng
        for i, (at, forced) in enumerate(times):
            rng = self.burst_rng if forced else main
            u_tenant = rng.random()
            tenant = self.tenants[forced] if forced else self.tenants[names[min(bisect.bisect(cum, u_tenant * acc),
                                                                              len(names) - 1)]]
            z_in, z_out = rng.gauss(0.0, 1.0), rng.gauss(0.0, 1.0)
            u_stream, u_reader, u_tps = rng.random(), rng.random(), rng.random()
            req = SimRequest(
                index=i, tenant=tenant.name, arrival_s=at, input_tokens=0, output_tokens=0,
                streaming=u_stream < tenant.stream_share, client_tps=0.0, route_u=rng.random(),
                hop_s=_lognormal(rng, cfg.hop_median_s, 0.4), error_u=rng.random(),
                error_frac=rng.random(), deadline_s=tenant.deadline_s,
            )
            in_med, in_sig, in_max = tenant.input_median, tenant.input_sigma, tenant.max_input
            out_med, out_sig, out_max = tenant.output_median, tenant.output_sigma, tenant.max_output
            lo, hi = cfg.slow_reader_tps if u_reader < tenant.slow_reader_share else cfg.fast_reader_tps
            req.fault_u, req.fault_extra_u = rng.random(), rng.random()
            for s in cfg.shifts:
                if s.tenant == tenant.name and s.start_s <= at < s.end_s:
                    in_med = s.input_median or in_med
                    in_sig = s.input_sigma if s.input_sigma is not None else in_sig
                    in_max = s.max_input or in_max
                    out_med = s.output_median or out_med
                    out_sig = s.output_sigma if s.output_sigma is not None else out_sig
                    out_max = s.max_output or out_max
                    if s.client_tps is not None:
                        lo, hi = s.client_tps
            req.input_tokens = max(1, min(in_max, round(in_med * math.exp(in_sig * z_in))))
            req.output_tokens = max(1, min(out_max, round(out_med * math.exp(out_sig * z_out))))
            req.client_tps = lo + (hi - lo) * u_tps
            req.hop_end_s = at + req.hop_s
            self.draw_attributes(req, self.burst_rng if forced else self.attr_rng)
            out.append(req)
        return out

    def draw_attributes(self, req: SimRequest, a: random.Random) -> None:
        """Priority class, LoRA adapter and prefix-cache hit of a request, from the attributes' own stream `a`."""
        u, acc = a.random(), 0.0
        for name, share in PRIORITIES:
            acc += share
            if u < acc:
                req.priority = name
                break
        u_lora, k, u_hit, frac = a.random(), a.randrange(len(LORA_ADAPTERS)), a.random(), a.uniform(0.2, 0.9)
        req.lora_adapter = LORA_ADAPTERS[k] if u_lora < LORA_SHARE else ""
        req.cached_tokens = int(req.input_tokens * frac) // 16 * 16 if u_hit < PREFIX_HIT_SHARE else 0
        for flush in self.cfg.cache_flushes:  # a would-be hit misses when its own hit draw falls in the lost share
            lost = PREFIX_HIT_SHARE * flush.miss_share
            if flush.start_s <= req.arrival_s < flush.end_s and u_hit < lost:
                lo, hi = flush.extra_s  # u_hit / lost: uniform on [0, 1), drawn for nothing else
                req.cached_tokens, req.prefill_extra_s = 0, lo + (hi - lo) * u_hit / lost

    # -- routing
    def refresh_routes(self, now: float) -> None:
        self.route_names, self.route_cum = [], []
        acc = 0.0
        for name, rep in self.replicas.items():
            spec = rep.spec
            if spec.joins_s <= now < spec.leaves_s and spec.weight > 0:
                acc += spec.weight
                self.route_names.append(name)
                self.route_cum.append(acc)

    def route(self, req: SimRequest, now: float) -> None:
        if not self.route_cum:
            raise ValueError(f"no replica takes traffic at t={now:.3f} s (check joins_s / leaves_s / weight)")
        total = self.route_cum[-1]
        k = min(bisect.bisect(self.route_cum, req.route_u * total), len(self.route_names) - 1)
        rep = self.replicas[self.route_names[k]]
        req.replica, req.zone, req.version = rep.spec.name, rep.spec.zone, rep.spec.version
        req.routed_s = now
        hop = self.cfg.forward_hop_s
        for fault in self.cfg.network_faults:
            hit = fault.node == rep.spec.node if fault.node else fault.zone == rep.spec.zone
            if hit and fault.start_s <= now < fault.end_s and req.fault_u < fault.probability:
                lo, hi = fault.extra_s
                hop += lo + (hi - lo) * req.fault_extra_u
        req.at_replica_s = now + hop
        self.push(req.at_replica_s, _AT_REPLICA, (rep, req))

    def at_replica(self, rep: _Replica, req: SimRequest, now: float) -> None:
        if now < rep.ready_s:
            req.load_end_s = rep.ready_s
        rep.queue.append(req)
        if now >= rep.ready_s:
            self.fill(rep, now)

    # -- replica mechanics
    def step_s(self, rep: _Replica) -> float:
        cfg = self.cfg
        return rep.speed * rep.spec.decode_factor * (cfg.step_base_s + cfg.step_per_seq_s * rep.busy)

    def sync_clock(self, rep: _Replica, now: float) -> None:
        if rep.decoding:
            rep.clock += (now - rep.clock_at) / self.step_s(rep)
        rep.clock_at = now

    def schedule_decode(self, rep: _Replica, now: float) -> None:
        rep.epoch += 1
        if rep.decoding:
            target = rep.decoding[0][0]
            self.push(now + max(0.0, target - rep.clock) * self.step_s(rep), _DECODE_CHECK, (rep, rep.epoch))

    def fill(self, rep: _Replica, now: float) -> None:
        cfg = self.cfg
        changed = False
        while rep.queue and rep.busy < cfg.slots:
            if not changed:
                self.sync_clock(rep, now)
                changed = True
            req = rep.queue.popleft()
            rep.busy += 1
            req.gen_start_s = now
            n = req.input_tokens
            prefill = cfg.prefill_fixed_s + n / cfg.prefill_tokens_per_s + (n / cfg.prefill_quadratic_tokens) ** 2
            self.push(now + prefill * rep.speed + req.prefill_extra_s, _PREFILL_DONE, (rep, req))
        if changed:
            self.schedule_decode(rep, now)

    def run(self) -> list[SimRequest]:
        cfg = self.cfg
        reqs = self.arrivals()
        for req in reqs:
            self.push(req.arrival_s, _ARRIVE, req)
        changes = sorted({0.0} | {s.joins_s for s in cfg.replicas} | {s.leaves_s for s in cfg.replicas
                                                                      if math.isfinite(s.leaves_s)})
        for t in changes:
            self.push(t, _ROUTES, None)
        for rep in self.replicas.values():
            if rep.spec.load_s > 0:
                self.push(rep.ready_s, _READY, rep)
        for th in cfg.throttles:
            self.push(th.start_s, _SPEED, (self.replicas[th.replica], th.factor))
            self.push(th.end_s, _SPEED, (self.replicas[th.replica], 1.0))
        self.refresh_routes(0.0)
        while self.events:
            now, kind, _, payload = heapq.heappop(self.events)
            if kind == _ROUTES:
                self.refresh_routes(now)
            elif kind == _ARRIVE:
                req = payload
                tok = req.input_tokens / cfg.tokenize_tokens_per_s + 0.002
                req.pre_end_s = req.hop_end_s + tok
                self.push(req.pre_end_s, _PRE_DONE, req)
            elif kind == _PRE_DONE:
                self.admit(payload, now)
            elif kind == _AT_REPLICA:
                rep, req = payload
                self.at_replica(rep, req, now)
            elif kind == _READY:
                self.fill(payload, now)
            elif kind == _SPEED:
                rep, factor = payload
                self.sync_clock(rep, now)
                rep.speed = factor
                self.schedule_decode(rep, now)
            elif kind == _PREFILL_DONE:
                rep, req = payload
                req.first_token_s = now
                if req.output_tokens <= 1:
                    req.decode_end_s = now
                    self.release(rep, req, now)
                else:
                    self.sync_clock(rep, now)
                    steps = float(req.output_tokens - 1)
                    for pre in cfg.preemptions:
                        if pre.priority == req.priority and pre.start_s <= req.gen_start_s < pre.end_s:
                            steps *= pre.factor
                    for swap in cfg.adapter_swaps:
                        if (swap.adapter == req.lora_adapter and swap.start_s <= req.gen_start_s < swap.end_s
                                and req.fault_u < swap.share):
                            steps *= swap.factor
                    req.decode_target = rep.clock + steps
                    heapq.heappush(rep.decoding, (req.decode_target, req.index, req))
                    self.schedule_decode(rep, now)
            elif kind == _DECODE_CHECK:
                rep, epoch = payload
                if epoch != rep.epoch:
                    continue
                self.sync_clock(rep, now)
                finished = []
                while rep.decoding and rep.decoding[0][0] <= rep.clock + 1e-9:
                    finished.append(heapq.heappop(rep.decoding)[2])
                for req in finished:
                    req.decode_end_s = now
                    self.release(rep, req, now)
                if not finished:
                    self.schedule_decode(rep, now)
        self.done.sort(key=lambda r: r.index)
        return self.done

    def admit(self, req: SimRequest, now: float) -> None:
        tenant = self.tenants[req.tenant]
        if self.tenant_busy[req.tenant] < tenant.max_concurrency:
            self.tenant_busy[req.tenant] += 1
            self.route(req, now)
        else:
            self.tenant_queue[req.tenant].append(req)

    def release(self, rep: _Replica, req: SimRequest, now: float) -> None:
        self.sync_clock(rep, now)
        rep.busy -= 1
        self.finish(req)
        self.tenant_busy[req.tenant] -= 1
        waiting = self.tenant_queue[req.tenant]
        if waiting:
            self.tenant_busy[req.tenant] += 1
            self.route(waiting.popleft(), now)
        self.fill(rep, now)
        self.schedule_decode(rep, now)

    def finish(self, req: SimRequest) -> None:
        """Stream delivery: the client reads at its own speed; the stream ends when it has read all."""
        if req.streaming:
            read_end = req.first_token_s + req.output_tokens / req.client_tps
            req.stream_end_s = max(req.decode_end_s, read_end) + 0.003
            req.end_s = req.stream_end_s
        else:
            req.end_s = req.decode_end_s + 0.002
        self.done.append(req)


def _apply_outcomes(cfg: FleetConfig, reqs: list[SimRequest]) -> None:
    """Errors and deadlines, decided per request from its own draws after the run."""
    for req in reqs:
        if req.error_u < cfg.error_rate:
            if req.error_frac < 0.4:  # rejected by validation right after preprocess
                req.status, req.error_type = "error", "InvalidRequestError"
                req.output_tokens = 0
                req.load_end_s = req.stream_end_s = None
                req.routed_s = req.at_replica_s = req.gen_start_s = req.pre_end_s
                req.first_token_s = req.decode_end_s = req.pre_end_s
                req.end_s = req.pre_end_s + 0.001
            else:  # the engine died part way through decode
                cut = req.first_token_s + (req.decode_end_s - req.first_token_s) * req.error_frac
                _truncate(req, cut, "error", "EngineDeadError")
        elif req.end_s - req.arrival_s > req.deadline_s:
            _truncate(req, req.arrival_s + req.deadline_s, "timeout", "DeadlineExceeded")


def _truncate(req: SimRequest, at: float, status: str, error_type: str) -> None:
    """End the request at `at`: later stage boundaries are clipped, tokens are those made by then."""
    req.status, req.error_type = status, error_type
    if req.first_token_s > at:
        req.output_tokens = 0
    elif req.decode_end_s > at and req.output_tokens > 1:
        made = (at - req.first_token_s) / (req.decode_end_s - req.first_token_s) * (req.output_tokens - 1)
        req.output_tokens = 1 + int(made)
    req.end_s = at
    for name in ("hop_end_s", "pre_end_s", "routed_s", "at_replica_s", "gen_start_s", "first_token_s",
                 "decode_end_s"):
        setattr(req, name, min(getattr(req, name), at))
    if req.load_end_s is not None:
        req.load_end_s = min(req.load_end_s, at)
    if req.stream_end_s is not None:
        req.stream_end_s = min(req.stream_end_s, at)


def simulate(cfg: FleetConfig, seed: int = 1) -> list[SimRequest]:
    """Run the fleet for `cfg.duration_s` simulated seconds; every request, in arrival order."""
    if not cfg.replicas or not cfg.tenants:
        raise ValueError("a fleet needs at least one replica and one tenant")
    reqs = _Sim(cfg, seed).run()
    _apply_outcomes(cfg, reqs)
    return reqs
