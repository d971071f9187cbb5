"""Every attribute a candidate dimension on ClickHouse: analysis.stats.attributes' three sources, rules and coding,
pushed down over the exporter's `SpanAttributes` / `ResourceAttributes` maps (text there; numbers parsed).

The frame's requests (the rows the report explains: in range, with a value) are read in passes that never hold
their attribute maps in memory, so the pass stays bounded as the table grows. The keys the stage spans agree on
(`stage`: the spans of its trace with a stage starting in its own hour or the hour on either side, the DuckDB
report's rule, attribute_values.stage_attribute_sql) are kept per request and key (ATTR_STAGE), the frame's
requests being the join's table in memory and the spans streaming past. The request spans' maps are streamed
to count what comes back per candidate, never per request: each key's count of requests, distinct values,
whether every value parses as a finite number (`parses_sql`: the text Arrow's cast reads, as the DuckDB report
tests) with the power-of-two buckets present (`number_key_sql`: attributes.number_keys in SQL) or, for text, its
values (at most MAX_VALUES + 1; each distinct value parsed once). Each key the rules may keep is then coded once,
a small column of ATTR_TEMP (the frame's requests joined by the request span's ids with its codes); each
replica's resource values come back as one row per replica and key (`resource`), the same-partition
test as two counts per pair. The keys are judged by attributes.Judge, the DuckDB report's own rules and
order. A kept key stays on the server as the SQL of its code (`ServerAttributes.code_sql`): the
explanation asks, per spike, the cells of every combination holding an attribute (alone, and with each
built-in) counted over the tail and the whole baseline (`cells`: the cells the tail holds enough of to pass, at
most 1 / MIN_SHARE each, with their tail counts; the family's count and those cells' baseline counts), the
nesting test's counts over the frame (`overlap`), the spike's p99s without a candidate (`spike_without`; the
baseline's through `candidate_sql`) and which of the exemplar pool's requests match the best (`prefer`: at most
k, more only on a tie). No request's codes come back.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from analysis.clickhouse.client import Client
from analysis.clickhouse.model import temp_engine
from analysis.clickhouse.promotion import source_sql
from analysis.clickhouse.quantiles import arrays_sql, quantile_sql
from analysis.clickhouse.requests import span_where
from analysis.clickhouse.server import features
from analysis.engine import model as M
from analysis.engine.dialect import CLICKHOUSE
from analysis.engine.percentiles import in_range_sql
from analysis.stats import attributes as A
from analysis.stats import explain as X

#: Session temporary tables of the attribute pass (their names' common start): the stage keys each request's stage
#: spans agree on (ATTR_STAGE, one row per request and key, while the keys are read), then the frame's requests with
#: each candidate key's code (ATTR_TEMP).
ATTR_PREFIX: Final = "_tailscope_attr"
ATTR_STAGE: Final = "_tailscope_attr_stage"
ATTR_TEMP: Final = "_tailscope_attr_codes"
#: A code's place in the single integer of a pair of codes (`same_partition_sql`): above every code (at most
#: attributes.MAX_VALUES labels; the built-ins' token buckets far fewer).
PAIR_SLOTS: Final = 1 << 16
#: Text Arrow's cast to a double reads as a number (analysis.stats.attributes.code_values' test); the value must
#: be finite too.
NUMBER_RE: Final = r"^[+-]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][+-]?[0-9]+)?$"

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


def bucket_code_sql(col: str) -> str:
    """explain.code_dimension's code of a token count by its very float formula: -1 missing or negative, 0 for 0,
    floor(log2(x)) + 1 above (so a count just below a large power of two codes as numpy's log2 puts it)."""
    return (f"multiIf({col} IS NULL OR {col} < 0, -1, {col} < 1, 0, "
            f"toInt64(floor(log2(toFloat64(greatest({col}, 1))))) + 1)")


def parses_sql(v: str) -> str:
    """Whether text `v` reads as a finite number."""
    return f"(match({v}, {CLICKHOUSE.literal(NUMBER_RE)}) AND isFinite(toFloat64OrZero({v})))"


def number_key_sql(v: str) -> str:
    """attributes.number_keys of text `v` (which parses): 0 for 0, else sign * BUCKET_SIGN + k + BUCKET_EXP0, with
    k = floor(log2 |x|) settled in doubles (powers of two are exact), not trusted to log2's rounding."""
    x = f"toFloat64OrZero({v})"
    ax = f"if({x} = 0, 1.0, abs({x}))"
    g = f"toInt64(floor(log2({ax})))"
    k = f"({g} - toInt64(pow(2.0, {g}) > {ax}) + toInt64(pow(2.0, {g} + 1) <= {ax}))"
    return f"if({x} = 0, 0, if({x} < 0, 2, 1) * {A.BUCKET_SIGN} + {k} + {A.BUCKET_EXP0})"


def _array(items: Sequence[Any], kind: str) -> str:
    lit = (CLICKHOUSE.literal if kind == "String" else str)
    return f"CAST([{', '.join(lit(x) for x in items)}], 'Array({kind})')"


def _code_of(value: str, labels: Sequence[Any], kind: str) -> str:
    """SQL of the code of `value` among `labels` (its position, -1 when absent): a hashed look-up."""
    if not labels:
        return "toInt64(-1)"
    cast = "toString" if kind == "String" else "toInt64"
    return f"transform({cast}({value}), {_array(labels, kind)}, {_array(list(range(len(labels))), 'Int64')}, " \
           "toInt64(-1))"


def builtin_code_sql(c: X.Coded) -> str:
    """SQL of a built-in dimension's code over ATTR_TEMP's columns (-1: missing), by its labels (`c`: the built-in
    as the explanation coded it)."""
    if c.name in X.BUCKETED:
        return bucket_code_sql(c.name)
    return f"if(isNull({c.name}), toInt64(-1), {_code_of(f'assumeNotNull({c.name})', c.labels, 'String')})"


def same_partition_sql(a: str, b: str, n: int) -> str:
    """Two counts over ATTR_TEMP whose zero and `width` say codes `a` and `b` (-1: missing) split its requests
    alike: `d{n}` the requests missing one and not the other, `p{n}` the distinct pairs of codes (one integer each:
    a hashed set of small integers, two to three times cheaper than one of tuples)."""
    return (f"countIf(({a}) < 0 != (({b}) < 0)) AS d{n}, "
            f"uniqExactIf(toUInt32({a}) * {PAIR_SLOTS} + toUInt32({b}), ({a}) >= 0) AS p{n}")


@dataclass
class ServerAttributes:
    """The attribute dimensions of a frame on the server: what was considered and skipped (`attrs`, whose coded
    dimensions hold labels but no codes) and the SQL of each kept one's code over ATTR_TEMP."""

    attrs: A.Attributes
    code_sql: dict[str, str] = field(default_factory=dict)
    #: The facts column ATTR_TEMP holds as `v` (None: no ATTR_TEMP, or no value in it).
    value: str | None = None
    #: The built-in dimensions coded over ATTR_TEMP's requests (labels only; None: no ATTR_TEMP).
    builtin: list[X.Coded] | None = None

    def candidate_sql(self, name: str, code: int) -> str:
        """The requests whose attribute dimension `name` has code `code`, as a predicate over trace_id / span_id."""
        return (f"(trace_id, span_id) IN (SELECT trace_id, span_id FROM {ATTR_TEMP} "
                f"WHERE {self.code_sql[name]} = {int(code)})")

    def dimension_sql(self, c: X.Coded) -> str:
        """SQL of a dimension's code over ATTR_TEMP's requests (-1: missing): a kept attribute's, a built-in's by its
        labels here (`c`: the built-in as the explanation coded it)."""
        if c.source != "builtin":
            return self.code_sql[c.name]
        return builtin_code_sql(c)

    def matches(self, coded: Sequence[X.Coded], cand: X.Candidate, codes: bool = False) -> str:
        """A candidate's requests as a predicate over ATTR_TEMP's columns (false where a dimension is missing), or
        with `codes` over `codes_sql`'s columns."""
        return " AND ".join(f"(d{i}) = {int(code)}" if codes else f"({self.dimension_sql(coded[i])}) = {int(code)}"
                            for i, code in zip(cand.dims, cand.codes, strict=True))

    def codes_sql(self, coded: Sequence[X.Coded], dims: Iterable[int]) -> str:
        """Each dimension's code over ATTR_TEMP as a column `d{i}`: a query testing many candidates reads them from a
        subquery, so each is computed once a row and written once, not once a candidate (a built-in's code is a
        look-up among all its labels: the server spent longer planning such queries than running them)."""
        return ", ".join(f"toInt64({self.dimension_sql(coded[i])}) AS d{i}" for i in sorted(set(dims)))

    def cells(self, client: Client, coded: Sequence[X.Coded], combos: list[tuple[int, ...]], tail: str, base: str,
              least: int, least_weight: float | None) -> dict[tuple[int, ...], X.Cells]:
        """explain.RemoteCells over ATTR_TEMP: per combination of `coded` (indices), the cells (values, or pairs of
        values) the requests meeting `tail` or `base` hold, missing values left out (the family's count), and the
        cells the `tail` requests hold at least `least` of with their tail and baseline counts; weighted
        (`least_weight`: the least tail weight that may pass the guard, else None) their summed weights too, and only
        the cells holding that much. So at most 1 / MIN_SHARE cells a combination come back: a row each, then one row
        of figures, the family's counts and those cells' baseline counts (one pass over the tail and the baseline; a
        single sumMap per combination doing both costs several times more)."""
        if not combos:
            return {}
        weighted = least_weight is not None
        cols = self.codes_sql(coded, (i for c in combos for i in c))
        slots = [len(c.labels) + 1 for c in coded]
        keys = [f"d{c[0]}" if len(c) == 1 else f"d{c[0]} * {slots[c[1]]} + d{c[1]}" for c in combos]
        helds = [" AND ".join(f"d{i} >= 0" for i in c) for c in combos]
        # the tail's cells with their counts (and weights), kept on the server past the least count: one (combination,
        # cell) pair per row and combination held, grouped (a short query: one aggregate per combination would cost
        # more to plan than to run)
        pairs = ", ".join(f"({n}, if({h}, {k}, -1))" for n, (k, h) in enumerate(zip(keys, helds, strict=True)))
        passes = f"t >= {int(least)}" + (f" AND tw >= {least_weight!r}" if weighted else "")
        got = client.query(
            f"SELECT c.1 AS n, c.2 AS cell, count() AS t{', sum(w) AS tw' if weighted else ''} FROM (SELECT w, {cols} "
            f"FROM {ATTR_TEMP} WHERE {tail}) ARRAY JOIN [{pairs}] AS c WHERE c.2 >= 0 GROUP BY n, cell "
            f"HAVING {passes} ORDER BY n, cell").to_pylist()
        hits: dict[int, list[int]] = {n: [] for n in range(len(combos))}
        t_counts: dict[int, list[int]] = {n: [] for n in range(len(combos))}
        t_weights: dict[int, list[float]] = {n: [] for n in range(len(combos))}
        for r in got:
            hits[int(r["n"])].append(int(r["cell"]))
            t_counts[int(r["n"])].append(int(r["t"]))
            if weighted:
                t_weights[int(r["n"])].append(float(r["tw"]))
        aggs = []
        for n, (c, k, h) in enumerate(zip(combos, keys, helds, strict=True)):
            aggs.append(f"uniqExactIf({k}, {h}) AS p{n}")
            for j, cell in enumerate(hits[n]):
                # a cell as the equality of each of its codes (its key decodes, both held): fewer expressions for the
                # server to plan and run than the key's (0.2 of 1.4 CPU-s at 1 M spans with 40 attributes)
                eq = (f"d{c[0]} = {cell}" if len(c) == 1
                      else f"d{c[0]} = {cell // slots[c[1]]} AND d{c[1]} = {cell % slots[c[1]]}")
                aggs.append(f"countIf(bs AND {eq}) AS b{n}_{j}")
                if weighted:
                    aggs.append(f"sumIf(w, bs AND {eq}) AS w{n}_{j}")
        row = client.query(f"SELECT {', '.join(aggs)} FROM (SELECT {tail} AS tl, {base} AS bs, w, {cols} "
                           f"FROM {ATTR_TEMP}) WHERE tl OR bs").to_pylist()[0]
        out = {}
        for n, c in enumerate(combos):
            size = slots[c[1]] if len(c) == 2 else 1
            codes: list[tuple[int, ...]] = [(x,) if len(c) == 1 else (x // size, x % size) for x in hits[n]]
            m = len(codes)
            out[c] = X.Cells(int(row[f"p{n}"]), codes, t_counts[n], [int(row[f"b{n}_{j}"]) for j in range(m)],
                             t_weights[n] if weighted else None,
                             [float(row[f"w{n}_{j}"]) for j in range(m)] if weighted else None)
        return out

    def spike_without(self, client: Client, coded: Sequence[X.Coded], cands: list[X.Candidate], spike: str,
                      weighted: bool) -> X.SpikeWithout:
        """explain.SpikeWithout of `cands` (by position) over the requests of ATTR_TEMP meeting `spike`: per
        candidate its requests left (their effective count, `weighted`) and their p99 (weighted) by the rule of
        percentiles.weighted_quantile_sorted. One row of figures comes back."""
        if not cands:
            return {}
        weight = "w" if weighted else None
        inner = ", ".join(arrays_sql("v", weight, f"NOT ({self.matches(coded, c, codes=True)})", prefix=f"c{n}_")
                          for n, c in enumerate(cands))
        outer = ", ".join(f"{quantile_sql(weight, X.TAIL_Q, prefix=f'c{n}_')} AS q{n}, c{n}_tot AS t{n}, "
                          f"c{n}_sq AS s{n}" for n in range(len(cands)))
        codes = self.codes_sql(coded, (i for c in cands for i in c.dims))
        rows = f"SELECT v{', w' if weighted else ''}, {codes} FROM {ATTR_TEMP} WHERE {spike}"
        row = client.query(f"SELECT {outer} FROM (SELECT {inner} FROM ({rows}))",
                           features(client).settings).to_pylist()[0]
        out = {}
        for n in range(len(cands)):
            tot, sq = float(row[f"t{n}"]), float(row[f"s{n}"])
            left = tot if not weighted else (tot * tot / sq if sq > 0 else 0.0)
            out[n] = (left, float(row[f"q{n}"]))
        return out

    def prefer(self, client: Client, coded: Sequence[X.Coded], cand: X.Candidate, among: str, k: int
               ) -> set[tuple[str, str]]:
        """The (trace_id, span_id) of the requests of ATTR_TEMP meeting `among` that match `cand`: the k of least
        value, ties kept (the exemplars read no further: at most k rows, more only on a tie)."""
        got = client.query(f"SELECT toString(trace_id) AS t, toString(span_id) AS s FROM {ATTR_TEMP} "
                           f"WHERE ({among}) AND {self.matches(coded, cand)} ORDER BY v LIMIT {int(k)} WITH TIES")
        return {(str(r["t"]), str(r["s"])) for r in got.to_pylist()}

    def overlap(self, client: Client, coded: Sequence[X.Coded], a: list[X.Candidate], b: list[X.Candidate]
                ) -> tuple[list[int], list[list[int]]]:
        """attributes.Overlap over ATTR_TEMP (the frame's requests): one row of counts comes back."""
        def has(c: X.Candidate) -> str:
            return f"({self.dimension_sql(coded[c.dims[0]])}) = {int(c.codes[0])}"

        parts = []
        for j, c in enumerate(a):
            parts.append(f"countIf({has(c)}) AS n{j}")
            parts += [f"countIf({has(c)} AND {has(d)}) AS b{j}_{k}" for k, d in enumerate(b)]
        row = client.query(f"SELECT {', '.join(parts)} FROM {ATTR_TEMP}").to_pylist()[0]
        return ([int(row[f"n{j}"]) for j in range(len(a))],
                [[int(row[f"b{j}_{k}"]) for k in range(len(b))] for j in range(len(a))])


def _keys_sql(pairs: str) -> str:
    """Per key of `pairs` (a query of (k, v) rows, one per request carrying key k): requests carrying it, distinct
    values, whether all parse as numbers (and all are integers), the number buckets present and up to
    MAX_VALUES + 1 of its values, each with its bucket (0 when not a number). Each key's distinct values are
    gathered first (a set per key: cheaper than grouping by key and value, 1.0 against 1.3 CPU-s at 1 M spans with
    40 attributes), so each is parsed once, however many requests carry it: in lambdas over the set, not per row of
    an ARRAY JOIN. Older releases (24.8) pay for planning each reference to a column of a subquery as large as
    `pairs`, and the value's parse and bucket name it about ten times: spelled per row, the statement cost 1.2
    CPU-s on 24.8, nearly all of it planning, against 0.2 on the newest release; a lambda's argument is no such
    reference (0.5 on 24.8, the same 0.2 on the newest)."""
    n = A.MAX_VALUES + 1
    x = "toFloat64OrZero(v)"
    nk = number_key_sql("v")
    return (f"SELECT k, present, length(vals) AS nd, arrayAll(o -> o, oks) AS num, "
            f"arrayAll((v, o) -> if(o, {x} = floor({x}), true), vals, oks) AS integral, "
            f"arrayDistinct(arrayFilter((b, o) -> o, nks, oks)) AS keys, arraySlice(vals, 1, {n}) AS texts, "
            f"arraySlice(nks, 1, {n}) AS text_keys "
            f"FROM (SELECT k, present, vals, oks, arrayMap((v, o) -> if(o, {nk}, 0), vals, oks) AS nks "
            f"FROM (SELECT k, present, vals, arrayMap(v -> {parses_sql('v')}, vals) AS oks "
            f"FROM (SELECT k, count() AS present, groupUniqArray(v) AS vals FROM ({pairs}) GROUP BY k)))")


def _value_code_sql(value: str, r: dict[str, Any], order: Sequence[Any]) -> str:
    """SQL of 1 + the code of text `value` of a key whose figures are `r` and codes' keys `order` (0: no code): by
    the text itself when every distinct value came back (one hashed look-up), else by its number bucket."""
    numeric = bool(r["num"])
    if len(r["texts"]) >= int(r["nd"]):  # every value: each text's code looked up directly
        at = {k: i + 1 for i, k in enumerate(order)}
        texts = [str(t) for t in r["texts"]]
        codes = [at.get(int(k) if numeric else x, 0) for x, k in zip(texts, r["text_keys"], strict=True)]
        return f"transform({value}, {_array(texts, 'String')}, {_array(codes, 'Int16')}, toInt16(0))"
    if not numeric:
        return "toInt16(0)"
    return (f"transform({number_key_sql(value)}, {_array(list(order), 'Int64')}, "
            f"{_array(list(range(1, len(order) + 1)), 'Int16')}, toInt16(0))")


class _Reader:
    """One pass of the attribute rules over the frame in ATTR_TEMP (see the module's docstring)."""

    def __init__(self, client: Client, table: str, lo: int | None, hi: int | None, rules: A.AttributeRules,
                 frame: str) -> None:
        self.client, self.table, self.lo, self.hi = client, table, lo, hi
        self.frame = frame
        self.n = int(client.query(f"SELECT count() AS n FROM ({frame})").to_pylist()[0]["n"])
        # the built-ins coded as explain.code_dimension codes them over the frame (labels only: their codes stay here)
        values = ", ".join(f"maxOrNull({bucket_code_sql(d)}) AS {d}" if d in X.BUCKETED
                           else f"groupUniqArray({d}) AS {d}" for d in X.DIMENSIONS)
        row = client.query(f"SELECT {values} FROM ({frame})").to_pylist()[0]
        none = np.zeros(0, dtype=np.int64)
        self.builtin = [X.bucketed(d, none, int(row[d]) if row[d] is not None else -1) if d in X.BUCKETED else
                        X.Coded(d, none, sorted(str(x) for x in row[d]), [None] * len(row[d]), [None] * len(row[d]))
                        for d in X.DIMENSIONS]
        self.judge = A.Judge(self.n, rules, self.builtin)
        self.code_sql: dict[str, str] = {}
        self._pending = ""
        self._same: dict[str, bool] | None = None
        #: the number of values (labels) of each built-in and each key `codes` coded, by its code's SQL, and the
        #: same-partition test of each pair of them with as many (asked once, on the first question)
        self.width: dict[str, int] = {builtin_code_sql(c): len(c.labels) for c in self.builtin}
        self._pairs: dict[frozenset[str], bool] | None = None
        self.rules = rules
        #: per source, its keys' figures and, per key that may be kept, its code's column in ATTR_TEMP
        self.found: dict[str, list[dict[str, Any]]] = {}
        self.column: dict[tuple[str, str], str] = {}

    def same_partition(self, a: X.Coded, b: X.Coded) -> bool:
        """attributes' same-partition test of the pending key `a` against `b`, counted on the server. The keys
        `codes` coded are tested against each other and the built-ins at once, every pair with as many values in one
        query, the first time one is asked (about 80 pairs at 1 M spans with 40 attributes: one query instead of
        33); a key coded later (a resource key) against every dimension with as many values, on its first question."""
        if len(a.labels) != len(b.labels):
            return False
        bcode = self._dimension_code(b)
        if self._pending in self.width and bcode in self.width:
            if self._pairs is None:
                self._pairs = self._all_pairs()
            return self._pairs[frozenset((self._pending, bcode))]
        if self._same is None:
            others = [c for c in [*self.builtin, *self.judge.out.coded] if len(c.labels) == len(a.labels)]
            parts = [same_partition_sql(self._pending, self._dimension_code(c), i) for i, c in enumerate(others)]
            row = self.client.query(f"SELECT {', '.join(parts)} FROM {ATTR_TEMP}").to_pylist()[0]
            self._same = {c.name: int(row[f"d{i}"]) == 0 and int(row[f"p{i}"]) == len(a.labels)
                          for i, c in enumerate(others)}
        return self._same[b.name]

    def _dimension_code(self, c: X.Coded) -> str:
        """SQL of a dimension's code over ATTR_TEMP (-1: missing): a built-in's by its labels, a key's column."""
        return builtin_code_sql(c) if c.source == "builtin" else self.code_sql[c.name]

    def _all_pairs(self) -> dict[frozenset[str], bool]:
        """The same-partition test of every pair of the coded keys and built-ins with as many values (`width`: by
        their code's SQL), one query."""
        codes = sorted(self.width)
        pairs = [(a, b) for i, a in enumerate(codes) for b in codes[i + 1:] if self.width[a] == self.width[b]]
        if not pairs:
            return {}
        parts = [same_partition_sql(a, b, n) for n, (a, b) in enumerate(pairs)]
        row = self.client.query(f"SELECT {', '.join(parts)} FROM {ATTR_TEMP}").to_pylist()[0]
        return {frozenset(ab): int(row[f"d{n}"]) == 0 and int(row[f"p{n}"]) == self.width[ab[0]]
                for n, ab in enumerate(pairs)}

    def _keep(self, coded: X.Coded, source: str, present: int, distinct: int, numeric: bool, code: str) -> None:
        self._pending, self._same = code, None
        before = len(self.judge.out.coded)
        self.judge.after_coding(coded, source, present, distinct, numeric, self.same_partition)
        if len(self.judge.out.coded) > before:
            self.code_sql[coded.name] = code

    def codes(self, engine: str, request_pairs: str, request_maps: str, value: str | None) -> None:
        """Read the keys of both sources (the request span's: `request_pairs`, its (k, v) rows; the stages':
        ATTR_STAGE), then write ATTR_TEMP: the frame's requests with the code of each key the rules may keep (one
        small column each, computed once: the request's from `request_maps`, its request spans' (TraceId, SpanId,
        SpanAttributes), joined by id, the stages' from ATTR_STAGE grouped by request), and drop ATTR_STAGE."""
        cols: list[str] = []
        per_source: dict[str, list[str]] = {"request": [], "stage": []}
        keys: dict[str, list[str]] = {"request": [], "stage": []}
        cases: list[str] = []  # per coded request key, its place and the SQL of 1 + the code of its value `x`
        for source, pairs in (("request", request_pairs), ("stage", f"SELECT k, v FROM {ATTR_STAGE}")):
            try:
                self.found[source] = self.client.query(_keys_sql(pairs)).to_pylist()
            except Exception as exc:
                self.found[source] = []
                self.judge.out.errors.append(
                    f"could not read the {source} attributes because {str(exc).splitlines()[0]}")
            scratch = A.Judge(self.n, self.rules, self.builtin)  # the rules read before coding, nothing recorded
            for r in self.found[source]:
                key, present = str(r["k"]), int(r["present"])
                if not scratch.before_coding(key, source, present):
                    continue
                order = self._labels(r)[0]
                if not order:  # past every bound: skipped as ids or by cardinality, never coded
                    continue
                name = f"{source[0]}{len(cols)}"
                self.width[name] = len(order)
                keys[source].append(key)
                j = len(keys[source])  # the key's place among its source's coded keys (`pos`)
                if source == "request":  # 1 + its code where the request span holds the key, else 0 (`m`)
                    cases.append(f"p = {j}, toInt16({_value_code_sql('x', r, order)})")
                    code = f"m[{j}]"
                else:  # one row per request and key in ATTR_STAGE
                    code = f"maxIf({_value_code_sql('v', r, order)}, pos = {j})"
                per_source[source].append(f"toInt16({code}) AS {name}")
                cols.append(f"toInt16({source[0]}.{name} - 1) AS {name}")
                self.column[(source, key)] = name
        f = ", ".join(["trace_id", "span_id", "start_ns", "toFloat64(adjusted_count) AS w",
                       f"toFloat64({value}) AS v" if value else "CAST(NULL AS Nullable(Float64)) AS v", *X.DIMENSIONS])
        sql = ", ".join(["SELECT f.trace_id AS trace_id, f.span_id AS span_id, f.start_ns AS start_ns, f.w AS w",
                         "f.v AS v", *(f"f.{d} AS {d}" for d in X.DIMENSIONS), *cols])
        sql += f" FROM (SELECT {f} FROM ({self.frame})) AS f"
        # each key's place among the coded keys of its source, one hashed look-up per key a span holds (then each
        # code finds its key's place among small integers, not by comparing every key's text)
        def place(src: str, k: str) -> str:
            return (f"transform({k}, {_array(keys[src], 'String')}, "
                    f"{_array(list(range(1, len(keys[src]) + 1)), 'UInt16')}, toUInt16(0))")

        if per_source["request"]:  # unmatched rows read 0 (join_use_nulls off): no code
            # each span's codes as a map by the key's place, every value coded in one lambda (a lambda's argument
            # costs nothing to plan; each reference to a column of this subquery, as large as `request_maps`, costs
            # the older releases about 0.01 CPU-s: one per key, not three to ten); the first of a repeated key
            # wins, as indexOf finds it, and a key the span lacks reads 0
            codes = (f"mapFromArrays(pos, arrayMap((p, x) -> multiIf({', '.join(cases)}, toInt16(0)), pos, vs)) "
                     "AS m")
            sql += (f" ANY LEFT JOIN (SELECT TraceId, SpanId, {', '.join(per_source['request'])} FROM (SELECT TraceId, "
                    f"SpanId, {codes} FROM (SELECT TraceId, SpanId, arrayMap(x -> {place('request', 'x')}, "
                    f"mapKeys(a)) AS pos, mapValues(a) AS vs FROM ({request_maps})))) AS r "
                    "ON r.TraceId = f.trace_id AND r.SpanId = f.span_id")
        if per_source["stage"]:
            sql += (f" ANY LEFT JOIN (SELECT t, sid, {', '.join(per_source['stage'])} FROM (SELECT t, sid, v, "
                    f"{place('stage', 'k')} AS pos FROM {ATTR_STAGE}) GROUP BY t, sid) AS s "
                    "ON s.t = f.trace_id AND s.sid = f.span_id")
        self.client.command(f"DROP TEMPORARY TABLE IF EXISTS {ATTR_TEMP}")
        self.client.command(f"CREATE TEMPORARY TABLE {ATTR_TEMP} ENGINE = {engine} AS {sql} "
                            "SETTINGS join_use_nulls = 0")
        self.client.command(f"DROP TEMPORARY TABLE IF EXISTS {ATTR_STAGE}")

    @staticmethod
    def _labels(r: dict[str, Any]) -> tuple[list[Any], list[str], list[int | None], list[int | None]]:
        """(the codes' keys: number buckets or texts, in code order; labels; low and high ends) of a key's figures;
        nothing for text past MAX_VALUES values."""
        if bool(r["num"]) and int(r["nd"]):
            order, labels, lo, hi = A.number_labels(sorted(int(k) for k in r["keys"]), bool(r["integral"]))
            return list(order), labels, lo, hi
        texts = sorted(str(t) for t in r["texts"])
        if len(texts) > A.MAX_VALUES:
            return [], [], [], []
        return list(texts), texts, [None] * len(texts), [None] * len(texts)

    def keys(self, source: str) -> None:
        """The request's or stage attributes (read by `codes`), most present first, judged in order."""
        for r in sorted(self.found.get(source, []), key=lambda r: (-int(r["present"]), str(r["k"]))):
            key, present, distinct = str(r["k"]), int(r["present"]), int(r["nd"])
            if not self.judge.before_coding(key, source, present) or self.judge.cut_past(key, source,
                                                                                         A.CUT_PRESENT):
                continue
            _, labels, lo, hi = self._labels(r)
            numeric = bool(r["num"]) and distinct > 0
            coded = X.Coded(key, np.zeros(0, dtype=np.int64), labels, lo, hi)
            self._keep(coded, source, present, distinct, numeric, self.column.get((source, key), "toInt64(-1)"))

    def resource(self) -> None:
        """The resource attributes of each request's replica (attributes._resource's rules), from a table over the
        replicas: one row per replica and key comes back."""
        reps = self.client.query(f"SELECT replica AS r, count() AS n FROM {ATTR_TEMP} WHERE replica IS NOT NULL "
                                 "GROUP BY r").to_pylist()
        per_rep = {str(r["r"]): int(r["n"]) for r in reps}
        labels = sorted(per_rep)
        if not labels:
            return
        worker = ", ".join(M.quote(s) for s in M.WORKER_STAGES)
        spans = source_sql(self.table, span_where(self.lo, self.hi))
        found = self.client.query(
            f"SELECT Replica AS r, k, groupUniqArray(2)(v) AS vs FROM {spans} "
            "ARRAY JOIN mapKeys(ResourceAttributes) AS k, mapValues(ResourceAttributes) AS v "
            f"WHERE Replica IS NOT NULL AND (IsRequest OR Stage IN ({worker})) "
            f"AND {in_range_sql('TimestampNs', self.lo, self.hi)} "
            f"AND NOT startsWith(k, {CLICKHOUSE.literal(A.OWN_PREFIX)}) "
            f"AND Replica IN (SELECT DISTINCT replica FROM {ATTR_TEMP} WHERE replica IS NOT NULL) "
            "GROUP BY r, k").to_pylist()
        at = {label: i for i, label in enumerate(labels)}
        per_key: dict[str, list[str | None]] = {}
        for row in found:
            vs = row["vs"]
            per_key.setdefault(str(row["k"]), [None] * len(labels))[at[str(row["r"])]] = (
                vs[0] if len(vs) == 1 else None)
        for key in sorted(per_key, key=lambda k: (-sum(v is not None for v in per_key[k]), k)):
            table = per_key[key]
            rep_codes = [i for i, v in enumerate(table) if v is not None]
            present = sum(per_rep[labels[i]] for i in rep_codes)
            if not self.judge.before_coding(key, "resource", present) or self.judge.cut_past(key, "resource", ""):
                continue
            values = pa.array([table[i] for i in rep_codes], type=pa.string())
            small, distinct, numeric = A.code_values(key, np.arange(len(rep_codes), dtype=np.int64), values,
                                                     len(rep_codes))
            code = (f"if(isNull(replica), -1, transform(assumeNotNull(replica), "
                    f"{_array([labels[i] for i in rep_codes], 'String')}, "
                    f"{_array(small.codes.tolist(), 'Int64')}, toInt64(-1)))")
            coded = X.Coded(key, np.zeros(0, dtype=np.int64), small.labels, small.lo, small.hi)
            self._keep(coded, "resource", present, distinct, numeric, code)


def read_attributes(client: Client, table: str, facts_table: str, frame_where: str, lo: int | None, hi: int | None,
                    rules: A.AttributeRules, value: str | None = None) -> ServerAttributes:
    """The attribute dimensions of the requests of `facts_table` meeting `frame_where` (the report's frame) from
    the spans of `table` starting in [lo, hi): attributes.read_attributes on the server. Leaves ATTR_TEMP
    (the frame's requests with their codes, and `value`, a facts column, as the double `v`) for the explanation;
    errors are recorded, never raised.

    No statement holds the requests' attribute maps in memory: the request spans' maps are streamed twice (their
    keys' figures, then each kept key's code into a join keyed by the span's ids), and only the stage keys the
    stage spans agree on are kept per request (ATTR_STAGE, one row per request and key)."""
    out = A.Attributes()
    spans = source_sql(table, span_where(lo, hi))
    ts = in_range_sql("TimestampNs", lo, hi)
    own = CLICKHOUSE.literal(A.OWN_PREFIX)
    hour = M.HOUR_NS
    frame = f"SELECT * FROM {facts_table} WHERE {frame_where}"
    # the frame's request spans, each once: of a span stored more than once, the copy the request model reads
    # (M.COPY_ORDER, the map last), as the DuckDB report does; the copies are found by id first, only they ordered
    request_maps = M.request_copy_sql(CLICKHOUSE, spans, ts, {"a": "SpanAttributes"})
    request_pairs = (f"SELECT k, v FROM (SELECT a FROM ({request_maps}) WHERE (TraceId, SpanId) IN "
                     f"(SELECT trace_id, span_id FROM ({frame}))) "
                     "ARRAY JOIN mapKeys(a) AS k, mapValues(a) AS v")
    # per request, each key of its stage spans (its trace's spans with a stage starting in its hour or the hour on
    # either side) they all agree on; the frame's requests are the join's table in memory, the spans stream past
    stage = f"""
SELECT g.trace_id AS t, g.span_id AS sid, st.k AS k, min(st.v) AS v
FROM (SELECT TraceId, TimestampNs, k, v FROM {spans}
      ARRAY JOIN mapKeys(SpanAttributes) AS k, mapValues(SpanAttributes) AS v
      WHERE Stage IS NOT NULL AND NOT IsRequest AND NOT startsWith(k, {own})) AS st
INNER JOIN (SELECT trace_id, span_id, intDiv(start_ns, {hour}) * {hour} AS h FROM ({frame})) AS g
  ON st.TraceId = g.trace_id
WHERE st.TimestampNs >= g.h - {hour} AND st.TimestampNs < g.h + {2 * hour}
GROUP BY t, sid, k HAVING min(st.v) = max(st.v)"""
    try:
        engine = temp_engine(client, frame)  # the frame's requests, as ATTR_STAGE and ATTR_TEMP hold them
        drop(client)
        # one thread: each thread's GROUP BY would hold nearly every request's groups (10 M spans: 0.68 GiB more at
        # the peak with two threads, for no less CPU; docs/scale-out.md#memory)
        client.command(f"CREATE TEMPORARY TABLE {ATTR_STAGE} ENGINE = {engine} AS {stage} SETTINGS max_threads = 1")
        reader = _Reader(client, table, lo, hi, rules, frame)
        reader.codes(engine, request_pairs, request_maps, value)
    except Exception as exc:
        out.errors.append(f"could not read the attributes because {str(exc).splitlines()[0]}")
        return ServerAttributes(out)
    for source in ("request", "stage"):
        reader.keys(source)
    try:
        reader.resource()
    except Exception as exc:
        reader.judge.out.errors.append(f"could not read the resource attributes because {str(exc).splitlines()[0]}")
    return ServerAttributes(reader.judge.out, reader.code_sql, value, reader.builtin)


def drop(client: Client) -> None:
    """Drop the session's tables of the attribute pass."""
    for name in (ATTR_STAGE, ATTR_TEMP):
        client.command(f"DROP TEMPORARY TABLE IF EXISTS {name}")
