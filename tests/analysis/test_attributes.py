"""Every attribute a candidate dimension: request, stage and resource attributes, the skip rules, the learned
hierarchy (the node named, the replica under it), the patterns, and the per-request coding against a plain
reference on a random store."""

from __future__ import annotations

import dataclasses
import math
import random
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from analysis import build_report, connect
from analysis.contract import Report
from analysis.stats import attributes as A
from analysis.stats import explain as X
from analysis.stats.explain import Coded, bucket_bounds, bucket_label
from tests.factory import T0, hex_id, write
from tracing import schema as S
from tracing.rows import SpanBatch

MS = 1_000_000
SEC = 1_000_000_000
WINDOWS = 10
PER_WINDOW = 600
REPLICAS = [f"gpu-{i:02d}" for i in range(24)]
NODE = {r: f"node-{i // 3}" for i, r in enumerate(REPLICAS)}  # three replicas a node
ZONE = {r: f"zone-{'ab'[i // 12]}" for i, r in enumerate(REPLICAS)}  # four nodes a zone
SLOW_NODE = "node-2"


def _append(batch: SpanBatch, trace: str, span: str, parent: str, name: str, start: int, end: int,
            resource: dict[str, str], attrs: dict[str, str], kind: str = "Internal") -> None:
    batch.append(trace_id=trace, span_id=span, parent_span_id=parent, name=name, kind=kind, start_ns=T0 + start,
                 end_ns=T0 + end, service="llm", resource=resource, attrs=attrs)


def node_store(path: Path) -> Path:
    """10 one-minute windows of 600 requests over 24 replicas on 8 nodes in 2 zones; in windows 5..6 every
    replica of node-2 decodes 4x slower. Requests carry ids, free text, a rare key, a cache-read count,
    a boolean, their own duration and a stage attribute."""
    batch = SpanBatch()
    rng = random.Random(7)
    for w in range(WINDOWS):
        for j in range(PER_WINDOW):
            i = w * PER_WINDOW + j
            rep = REPLICAS[(j * 5) % len(REPLICAS)]
            start = w * 60 * SEC + j * 100 * MS
            decode = (1000 + (j * 617) % 1000) * MS
            if w in (5, 6) and NODE[rep] == SLOW_NODE:
                decode *= 4
            q1, p1 = start + 20 * MS, start + 70 * MS
            end = p1 + decode
            resource = {"service.name": "llm", "service.instance.id": rep, "k8s.node.name": NODE[rep],
                        "cloud.availability_zone": ZONE[rep]}
            attrs = {S.ATTR_REQUEST: "true", "gen_ai.request.model": "llama", S.ATTR_TENANT: "acme",
                     "gen_ai.usage.input_tokens": str(100 + j % 900), "gen_ai.usage.output_tokens": "200",
                     "request.id": f"req-{i}", "user.note": f"note {rng.random():.6f}",
                     "gen_ai.usage.cache_read.input_tokens": str((0, 0, 64, 300, 1024)[j % 5]),
                     "retry": ("true", "false")[j % 2],
                     # the request's own latency, as a server might record it: an effect, never a candidate
                     "server.duration_ms": str((end - start) // (100 * MS) * 100)}
            if i % 250 == 0:
                attrs["rare.key"] = "x"
            trace, root = hex_id("trace", i, size=32), hex_id("span", i, "request")
            _append(batch, trace, root, "", "request", start, end, resource, attrs, kind="Server")
            gen = hex_id("span", i, "generation")
            layout = ("paged", "flat")[int(j % 3 == 0)]
            _append(batch, trace, hex_id("span", i, "q"), root, "queue_wait", start, q1, resource,
                    {S.ATTR_STAGE: "queue_wait"})
            _append(batch, trace, gen, root, "generation", q1, end, resource, {S.ATTR_STAGE: "generation"})
            _append(batch, trace, hex_id("span", i, "p"), gen, "prefill", q1, p1, resource,
                    {S.ATTR_STAGE: "prefill", "kv.layout": layout})
            _append(batch, trace, hex_id("span", i, "d"), gen, "decode", p1, end, resource,
                    {S.ATTR_STAGE: "decode", "kv.layout": layout})
    write(path, batch)
    return path


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return node_store(tmp_path_factory.mktemp("nodes"))


@pytest.fixture(scope="module")
def report(nodes: Path) -> Report:
    return build_report(connect(nodes))


def test_the_node_is_named_with_its_replica_under_it(report: Report) -> None:
    assert len(report["spikes"]) == 1
    top = report["spikes"][0]["dimensions"][0]
    assert (top["dimension"], top["value"], top["attribute"], top["source"]) == (
        "k8s.node.name", SLOW_NODE, "k8s.node.name", "resource")
    explained = top["explained"]
    assert explained is not None and explained > 0.8
    # the finer level: replicas of node-2 alone explain clearly less; the zone holding node-2 is the coarser
    node_replicas = {r for r in REPLICAS if NODE[r] == SLOW_NODE}
    assert top["finer"] and {f["value"] for f in top["finer"]} <= node_replicas
    assert all(f["dimension"] == "replica" and f["explained"] is not None
               and f["explained"] < explained - A.HIERARCHY_MARGIN for f in top["finer"])
    assert [(c["dimension"], c["value"]) for c in top["coarser"]] in ([], [("cloud.availability_zone", "zone-a")])


def test_considered_and_skipped_say_what_and_why(report: dict[str, Any]) -> None:
    attrs = report["attributes"]
    considered = {(c["attribute"], c["source"], c["kind"]) for c in attrs["considered"]}
    assert considered == {("gen_ai.usage.cache_read.input_tokens", "request", "number"),
                          ("retry", "request", "text"), ("kv.layout", "stage", "text"),
                          ("k8s.node.name", "resource", "text"), ("cloud.availability_zone", "resource", "text")}
    skipped = {(s["attribute"], s["source"]): s["reason"] for s in attrs["skipped"]}
    assert skipped == {
        ("request.id", "request"): "ids", ("user.note", "request"): "ids", ("rare.key", "request"): "rare",
        ("gen_ai.request.model", "request"): "builtin", (S.ATTR_TENANT, "request"): "builtin",
        ("gen_ai.usage.input_tokens", "request"): "builtin", ("gen_ai.usage.output_tokens", "request"): "builtin",
        (S.ATTR_REQUEST, "request"): "tailscope", ("server.duration_ms", "request"): "timing",
        ("service.instance.id", "resource"): "same_partition", ("service.name", "resource"): "same_partition"}
    assert attrs["cut"] == 0 and attrs["errors"] == []
    cache = next(c for c in attrs["considered"] if c["attribute"] == "gen_ai.usage.cache_read.input_tokens")
    assert cache["values"] == 4  # 0 (its own bucket), 64-127, 256-511, 1024-2047
    # every candidate of the family is counted in the correction: the six and their pairs, and each attribute
    spike = report["spikes"][0]
    assert spike["candidates_tested"] > len(REPLICAS) + 4 + 2


def test_patterns_rule_dimensions_out_and_the_zone_is_named_instead(nodes: Path) -> None:
    out = build_report(connect(nodes), exclude_dimensions="k8s.*")
    assert out["attributes"] is not None
    assert ("k8s.node.name", "pattern") in {(s["attribute"], s["reason"]) for s in out["attributes"]["skipped"]}
    top = out["spikes"][0]["dimensions"][0]
    assert (top["dimension"], top["value"]) != ("k8s.node.name", SLOW_NODE)
    only = build_report(connect(nodes), dimensions="replica,cloud.*")
    names = {d["dimension"] for d in only["spikes"][0]["dimensions"]}
    assert names <= {"replica", "cloud.availability_zone", "replica&cloud.availability_zone"}
    assert only["attributes"] is not None
    assert {s["dimension"] for s in only["attributes"]["skipped"] if s["source"] == "builtin"} == {
        "model", "model_version", "tenant", "input_tokens", "output_tokens"}


def _reference_bucket(x: float) -> str:
    """The label number_buckets gives an integer (the token buckets')."""
    lo, hi = bucket_bounds(int(abs(x)))
    return bucket_label(lo, hi) if x >= 0 else f"-({bucket_label(lo, hi)})"


def test_number_buckets_match_a_plain_reference() -> None:
    rng = np.random.default_rng(3)
    ints = np.concatenate([[0.0, 1.0, 2.0, 3.0, 4.0, -1.0, -5.0], rng.integers(-5000, 70000, 3000).astype(float)])
    codes, labels, los, his = A.number_buckets(ints)
    assert [labels[c] for c in codes] == [_reference_bucket(x) for x in ints]
    for c, x in zip(codes, ints, strict=True):
        assert los[c] is not None and his[c] is not None and los[c] <= x <= his[c]
    fracs = np.array([0.0, 0.3, 0.5, 0.75, 1.5, 3.0, math.nan])
    codes, labels, _, _ = A.number_buckets(fracs)
    assert [labels[c] if c >= 0 else None for c in codes] == ["0", "0.25-0.5", "0.5-1", "0.5-1", "1-2", "2-4",
                                                            None]


#: A second key naming `color`'s groups otherwise in random_store: split alike, so the later one (by name) is skipped.
SHADES = {"red": "warm", "green": "cool", "blue": "deep"}
SHADE_SKIPPED = {"attribute": "shade", "source": "request", "reason": "same_partition",
                 "why": "splits the requests exactly as 'color' does"}


def random_store(path: Path, seed: int) -> tuple[Path, dict[str, dict[str, str]]]:
    """A store of random requests with random request, stage and resource attributes; and the value each
    request should have of each key under the module's rules (written plainly: the reference)."""
    rng = random.Random(seed)
    batch = SpanBatch()
    replicas = [f"r{i}" for i in range(6)]
    # a replica's resource: `host` always one value; `rack` two values on r5 (its processes disagree)
    expected: dict[str, dict[str, str]] = {}
    for i in range(400):
        rep = rng.choice(replicas)
        start = i * 50 * MS
        end = start + rng.randint(50, 500) * MS
        rack = f"rack-{replicas.index(rep) % 3}"
        res = {"service.name": "llm", "service.instance.id": rep, "host": f"h{replicas.index(rep) // 2}",
               "rack": rack if rep != "r5" else f"rack-{i % 2}"}
        attrs = {S.ATTR_REQUEST: "true", "color": rng.choice(["red", "green", "blue"])}
        attrs["shade"] = SHADES[attrs["color"]]  # the same groups as `color`: skipped (same partition)
        if rng.random() < 0.7:
            attrs["n"] = str(rng.choice([0, 1, 3, 17, 100, 4096]))
        stage_vals = [rng.choice(["a", "b", None]) for _ in range(2)]
        trace, root = hex_id("rt", seed, i, size=32), hex_id("rs", seed, i)
        _append(batch, trace, root, "", "request", start, end, res, attrs, kind="Server")
        mid = (start + end) // 2
        for n, (st, s0, s1) in enumerate((("prefill", start, mid), ("decode", mid, end))):
            sattrs = {S.ATTR_STAGE: st}
            phase = stage_vals[n]
            if phase is not None:
                sattrs["phase"] = phase
            _append(batch, trace, hex_id("rst", seed, i, n), root, st, s0, s1, res, sattrs)
        want = {"color": attrs["color"]}
        if "n" in attrs:
            want["n"] = _reference_bucket(float(attrs["n"]))
        seen = {v for v in stage_vals if v is not None}
        if len(seen) == 1:
            want["phase"] = seen.pop()
        want["host"] = res["host"]
        want["service.name"] = "llm"
        if rep != "r5":
            want["rack"] = rack
        expected[trace] = want
    write(path, batch)
    return path, expected


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_each_request_gets_the_value_the_rules_give(tmp_path: Path, seed: int) -> None:
    store, expected = random_store(tmp_path / "s", seed)
    con = connect(store)
    from analysis.engine.percentiles import request_facts

    facts = request_facts(con)
    rows = con.sql(f"SELECT rid, trace_id, replica FROM {facts} ORDER BY rid").fetchall()
    rid = np.array([r[0] for r in rows], dtype=np.int64)
    labels = sorted({r[2] for r in rows})
    replica = Coded("replica", np.array([labels.index(r[2]) for r in rows], dtype=np.int64), labels,
                      [None] * len(labels), [None] * len(labels))
    out = A.read_attributes(con, f"SELECT rid, trace_id, span_id, start_ns FROM {facts}", {}, rid, replica, [replica],
                            A.AttributeRules(), None, None)
    by_name = {c.name: c for c in out.coded}
    assert set(by_name) == {"color", "n", "phase", "host", "rack", "service.name"}, out.skipped
    assert SHADE_SKIPPED in out.skipped
    for k, (_, trace, _) in enumerate(rows):
        got = {name: c.labels[c.codes[k]] for name, c in by_name.items() if c.codes[k] >= 0}
        assert got == expected[trace], trace


def test_a_watch_alert_carries_the_attribute_and_its_value(nodes: Path) -> None:
    from analysis.watch import Config, replay

    # the spike's windows (5..6) evaluated live, four windows of history before them
    alerts = replay(nodes, Config(window_s=60, delay_s=60, lookback=4, dashboard_url="http://127.0.0.1:8501"),
                    T0 + 5 * 60 * SEC, T0 + 7 * 60 * SEC)
    spikes = [a for a in alerts if a["kind"] == "tail_spike"]
    assert spikes, alerts
    top = spikes[0]
    assert (top["dimension"], top["value"], top["attribute"], top["attribute_source"]) == (
        "k8s.node.name", SLOW_NODE, "k8s.node.name", "resource"), top
    # its dashboard link opens the Spike page with the sidebar's attribute filter on that node
    assert top["dashboard_url"].endswith(f"&attr=k8s.node.name&attr_value={SLOW_NODE}"), top["dashboard_url"]


def test_the_cli_options_and_the_setting_rule_dimensions_out(nodes: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from typer.testing import CliRunner

    from tailscope.cli import app

    runner = CliRunner()
    monkeypatch.setenv("TAILSCOPE_EXCLUDE_DIMENSIONS", "retry")
    out = runner.invoke(app, ["report", "--json", "--no-materialize", "--store", str(nodes),
                              "--exclude-dimensions", "k8s.*,cloud.*"])
    assert out.exit_code == 0, out.output
    skipped = {s["attribute"]: s for s in json.loads(out.stdout)["attributes"]["skipped"]}
    assert skipped["k8s.node.name"]["why"] == "excluded by the pattern 'k8s.*'"
    assert skipped["cloud.availability_zone"]["reason"] == "pattern"
    assert skipped["retry"]["why"] == "excluded by the pattern 'retry'"  # the setting's, added to the option's


TENANTS = ("acme", "globex", "initech")


def pair_store(path: Path, per_window: int = PER_WINDOW) -> Path:
    """10 one-minute windows of 600 (`per_window`) requests over 24 replicas on 8 nodes, three tenants; in windows
    5..6 only the requests of tenant globex on node-2 decode 5x slower (neither the node nor the tenant alone)."""
    batch = SpanBatch()
    for w in range(WINDOWS):
        for j in range(per_window):
            i = w * per_window + j
            rep = REPLICAS[(j * 5) % len(REPLICAS)]
            tenant = TENANTS[(j // 7) % 3]
            start = w * 60 * SEC + j * (60 * SEC // per_window)
            decode = (1000 + (j * 617) % 1000) * MS
            if w in (5, 6) and NODE[rep] == SLOW_NODE and tenant == "globex":
                decode *= 5
            p1 = start + 70 * MS
            end = p1 + decode
            resource = {"service.name": "llm", "service.instance.id": rep, "k8s.node.name": NODE[rep]}
            attrs = {S.ATTR_REQUEST: "true", "gen_ai.request.model": "llama", S.ATTR_TENANT: tenant}
            trace, root = hex_id("pt", i, size=32), hex_id("ps", i)
            _append(batch, trace, root, "", "request", start, end, resource, attrs, kind="Server")
            _append(batch, trace, hex_id("pp", i), root, "prefill", start, p1, resource, {S.ATTR_STAGE: "prefill"})
            _append(batch, trace, hex_id("pd", i), root, "decode", p1, end, resource, {S.ATTR_STAGE: "decode"})
    write(path, batch)
    return path


#: The pair the pair store's cause is, as the report names it.
PAIR = {"dimension": "tenant&k8s.node.name", "value": f"globex&{SLOW_NODE}", "attribute": "tenant&k8s.node.name",
        "source": "builtin&resource"}


def check_pair_named(report: Report) -> None:
    """The pair store's report: the pair (tenant globex on node-2) among the dimensions by its name, the most
    over-represented of all and explaining the whole excess; its two parts first (each explains as much: removing
    node-2 removes the pair with it, and a pair ranks above a single only when it explains clearly more)."""
    assert len(report["spikes"]) == 1
    dims = report["spikes"][0]["dimensions"]
    pair = next(d for d in dims if "&" in d["dimension"])
    assert {k: v for k, v in pair.items() if k in PAIR} == PAIR, pair
    assert [(c["dimension"], c["value"], c["attribute"]) for c in pair["conditions"]] == [
        ("tenant", "globex", None), ("k8s.node.name", SLOW_NODE, "k8s.node.name")]
    explained = pair["explained"]
    assert pair["score"] == max(d["score"] for d in dims) and explained is not None and explained > 0.95
    assert {(d["dimension"], d["value"]) for d in dims[:2]} == {("k8s.node.name", SLOW_NODE), ("tenant", "globex")}
    # it explains no more than its parts (each 1.00): folded under the one ranked first, the tables show it there
    assert pair["folded_under"] == 0 and dims.index(pair) == 2


def test_a_pair_of_an_attribute_and_a_builtin_is_found_and_named(tmp_path: Path) -> None:
    check_pair_named(build_report(connect(pair_store(tmp_path / "p"))))


def _plain_family(codes: list[np.ndarray], tail: np.ndarray, base: np.ndarray, nb: int
                  ) -> tuple[int, dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[int, int]]]:
    """The family a plain reading of the rule counts: every value, and every pair of values of two dimensions one
    of which is among the first `nb`, held by a tail or baseline row (missing values left out); and each
    candidate's (tail, baseline) counts."""
    combos: list[tuple[int, ...]] = [(i,) for i in range(len(codes))]
    combos += [c for c in combinations(range(len(codes)), 2) if c[0] < nb]
    family = 0
    counts: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[int, int]] = {}
    for combo in combos:
        held: set[tuple[int, ...]] = set()
        for rows, side in ((tail, 0), (base, 1)):
            for r in rows.tolist():
                value = tuple(int(codes[i][r]) for i in combo)
                if min(value) < 0:
                    continue
                held.add(value)
                t, b = counts.get((combo, value), (0, 0))
                counts[(combo, value)] = (t + (side == 0), b + (side == 1))
        family += len(held)
    return family, counts


def _random_coded(seed: int, nb: int = 3, n: int = 900) -> tuple[list[Coded], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    sizes = [int(rng.integers(1, 6)) for _ in range(nb + 4)]
    codes = [np.where(rng.random(n) < 0.1, -1, rng.integers(0, k, n)).astype(np.int64) for k in sizes]
    # a planted combination: the first built-in's 0 with the first attribute's 1, many in the tail
    order = rng.permutation(n)
    tail, base = np.sort(order[:120]), np.sort(order[120:])
    codes[0][tail[:60]], codes[nb][tail[:60]] = 0, 1
    coded = [Coded(f"d{i}", c, [str(v) for v in range(k)], [None] * k, [None] * k,
                   source="builtin" if i < nb else "request")
             for i, (c, k) in enumerate(zip(codes, sizes, strict=True))]
    return coded, tail, base


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_the_family_counts_the_pairs_of_attributes_with_builtins(seed: int) -> None:
    nb = 3
    coded, tail, base = _random_coded(seed, nb)
    found, tested = X.contrast_raw(coded, tail, base, pairs_with=nb)
    family, counts = _plain_family([c.codes for c in coded], tail, base, nb)
    assert tested == family
    for c in found:
        assert (c.tail_count, c.base_count) == counts[(c.dims, c.codes)]
    assert any(c.dims == (0, nb) and c.codes == (0, 1) for c in found)
    assert not any(len(c.dims) == 2 and min(c.dims) >= nb for c in found)  # no pair of two attributes


@pytest.mark.parametrize(("seed", "everything"), [(1, False), (2, False), (3, False), (1, True), (2, True),
                                                  (3, True)])
def test_a_remote_engines_cells_give_the_same_candidates(seed: int, everything: bool) -> None:
    """The combinations holding an attribute counted elsewhere (as ClickHouse does: the family's count and the
    cells with at least the least support, from a plain count here) give the very candidates, in the same order.
    `everything`: the built-ins' combinations too (`remote_from=0`), the dimensions without codes here and the
    baseline one count (X.Rest of no dimension), as ClickHouse's report counts them when its attribute pass ran."""
    nb = 3
    coded, tail, base = _random_coded(seed, nb)
    _, counts = _plain_family([c.codes for c in coded], tail, base, nb)
    asked: list[tuple[int, ...]] = []

    def remote(dims: Any, combos: list[tuple[int, ...]], tail_rows: X.Part, least: int
               ) -> dict[tuple[int, ...], X.Cells]:
        assert isinstance(tail_rows, np.ndarray)  # the tail's rows here (a Counted one only from ClickHouse)
        assert np.array_equal(tail_rows, tail) and least == X.least_support(tail.size, False)
        asked.extend(combos)
        out = {}
        for combo in combos:
            cells = sorted((v, tb) for (k, v), tb in counts.items() if k == combo)
            hits = [(v, tb) for v, tb in cells if tb[0] >= least]
            out[combo] = X.Cells(len(cells), [v for v, _ in hits], [t for _, (t, _) in hits],
                                 [b for _, (_, b) in hits])
        return out

    want = X.contrast_raw(coded, tail, base, pairs_with=nb)
    if everything:
        none = np.zeros(0, dtype=np.int64)
        labels_only = [dataclasses.replace(c, codes=none) for c in coded]
        rest = X.Rest([], np.asarray([base.size]), lambda cand: np.zeros(0))
        got = X.contrast_raw(labels_only, tail, none, pairs_with=nb, remote=remote, rest=rest, remote_from=0)
        assert got == want and want[0]
        assert sorted(asked) == sorted(X.family_combos(coded, True, nb))
        return
    got = X.contrast_raw(coded, tail, base, pairs_with=nb, remote=remote)
    assert got == want and want[0]
    assert asked and all(max(c) >= nb for c in asked)


def test_the_least_support_is_the_guards_own() -> None:
    for n in range(1, 400):
        k = X.least_support(n, False)
        assert k >= X.MIN_SUPPORT and k / n >= X.MIN_SHARE
        assert k == X.MIN_SUPPORT or (k - 1) / n < X.MIN_SHARE


def test_pairs_past_the_cell_bound_are_cut_and_said(monkeypatch: pytest.MonkeyPatch) -> None:
    nb = 3
    coded, tail, base = _random_coded(1, nb)
    slots = [len(c.labels) + 1 for c in coded]
    bound = sorted(slots[i] * slots[j] for i, j in combinations(range(len(coded)), 2) if i < nb)[5]
    monkeypatch.setattr(X, "MAX_PAIR_CELLS", bound)
    cut: list[dict[str, Any]] = []
    found, _ = X.contrast_raw(coded, tail, base, pairs_with=nb, cut=cut)
    want = [(f"d{i}&d{j}", slots[i] * slots[j]) for i, j in combinations(range(len(coded)), 2)
            if i < nb and slots[i] * slots[j] > bound]
    assert [(c["dimension"], c["cells"]) for c in cut] == want and want
    assert all(str(bound) in c["why"].replace(",", "") for c in cut)
    assert not any(len(c.dims) == 2 and slots[c.dims[0]] * slots[c.dims[1]] > bound for c in found)


def test_a_resource_keys_counts_are_its_codes_counts(nodes: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A resource key's rows per value, taken from its replicas' counts, are those of its codes, counted one by one."""
    seen: list[Any] = []
    keep = A.Judge.after_coding

    def after_coding(self: A.Judge, coded: Any, source: str, present: int, *args: Any, **kw: Any) -> None:
        if source == "resource":
            seen.append((coded, present))
        keep(self, coded, source, present, *args, **kw)

    monkeypatch.setattr(A.Judge, "after_coding", after_coding)
    build_report(connect(nodes))
    assert {c.name for c, _ in seen} >= {"k8s.node.name", "cloud.availability_zone", "service.instance.id"}
    for coded, present in seen:
        codes = coded.codes.tolist()
        expected = [codes.count(k) for k in range(len(coded.labels))] + [codes.count(-1)]
        assert coded.counts is not None and coded.counts.tolist() == expected
        assert present == len(codes) - codes.count(-1)
