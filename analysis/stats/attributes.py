"""Every attribute of a request as a candidate dimension of the explanation, coded once for the report's frame.

Three sources, each giving at most one value per request:

- `request`: the request span's own attributes (`SpanAttributes`).
- `stage`: the attributes of the request's stage spans (the spans of its trace with a stage):
  a key's value is the one value every stage span carrying it agrees on; where they disagree
  the request has no value for it.
- `resource`: the resource attributes of the process that served the request, i.e. of its
  replica (the replica rule, docs/convention.md#replica): a key's value is the one value the
  replica's request and worker-stage spans carry; a replica whose spans disagree gives none.

Text values are values, booleans too ("true" / "false"); a key whose every value parses as a
number is bucketed by powers of two (`number_buckets`: 0 is its own bucket). What cannot be a
dimension is skipped with a reason (`SKIP_REASONS`): tailscope's own keys and those the
built-in dimensions read, glob patterns (`AttributeRules`), keys on too few requests, ids
(values about unique per request) and keys with more values than the bound relative to the
window's requests, keys partitioning requests exactly as another dimension does (a replica's
`service.instance.id`), and past MAX_ATTRIBUTES the rarest keys (cut, and said).
"""

from __future__ import annotations

import ctypes
import fnmatch
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import duckdb
import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from analysis.engine import attribute_values as AV
from analysis.engine.attribute_values import (
    OWN_PREFIX,
    StoredColumn,
    StoredValues,
    from_numpy,
    resource_rows,
    split_grouped,
    strings,
    timing_pattern,
    to_numpy,
)
from analysis.engine.model import HOUR_NS
from analysis.kernel import load_kernel
from analysis.stats.explain import Coded, bucket_label, counts_of

SOURCES: Final[tuple[str, ...]] = ("request", "stage", "resource")
#: A key must be on at least this share of the window's requests (and MIN_PRESENT of them).
MIN_PRESENCE: Final = 0.01
MIN_PRESENT: Final = 10
#: Ids: a key with at least this many distinct values per request carrying it.
UNIQUE_SHARE: Final = 0.5
#: The cardinality bound: at most this share of the window's requests, and at most MAX_VALUES, distinct values.
MAX_VALUE_SHARE: Final = 0.05
MAX_VALUES: Final = 4096
#: At most this many attribute dimensions (the most present first); the others are cut, and the report says so.
MAX_ATTRIBUTES: Final = 64
#: Why an attribute is not a dimension (the `reason` of a skipped entry).
#: Keys the built-in dimensions are read from, keys recording the request's own timing, and the SQL reading each
#: request's attribute values: analysis.engine.attribute_values's (materialized hours are written by the same rules).
BUILTIN_KEYS: Final = AV.BUILTIN_KEYS
TIMING_PATTERNS: Final = AV.TIMING_PATTERNS
request_attribute_sql = AV.request_attribute_sql
stage_attribute_sql = AV.stage_attribute_sql
resource_attribute_sql = AV.resource_attribute_sql
SKIP_REASONS: Final[tuple[str, ...]] = ("builtin", "tailscope", "timing", "pattern", "rare", "ids", "cardinality",
                                        "same_partition", "shadowed", "cut", "source")
_OWN_PREFIX: Final = OWN_PREFIX
#: The cut's reason for request and stage keys (resource keys: none).
CUT_PRESENT: Final = " (the most present first)"

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
#: A run of a LazyCoded: its first frame position, its end, the file codes of those rows, the table from a file code
#: to a label code (-1: missing).
Run = tuple[int, int, npt.NDArray[np.integer[Any]], I64]


@dataclass(frozen=True)
class AttributeRules:
    """Which dimensions a report considers: glob patterns on dimension names (attribute keys or the built-in
    names). `include` empty: every one; a name matching any `exclude` pattern is left out."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def ruled_out(self, name: str) -> str | None:
        """Why the patterns rule `name` out, or None when they keep it."""
        for pat in self.exclude:
            if fnmatch.fnmatchcase(name, pat):
                return f"excluded by the pattern {pat!r}"
        if self.include and not any(fnmatch.fnmatchcase(name, pat) for pat in self.include):
            return f"matches none of the --dimensions patterns ({', '.join(self.include)})"
        return None

    @staticmethod
    def parse(patterns: str | Sequence[str] | None) -> tuple[str, ...]:
        """Comma-separated (or listed) glob patterns, blanks dropped."""
        if patterns is None:
            return ()
        items = patterns.split(",") if isinstance(patterns, str) else [p for x in patterns for p in x.split(",")]
        return tuple(p.strip() for p in items if p.strip())


@dataclass
class Attributes:
    """The attribute dimensions of a frame (coded, aligned with its rows) and what was considered and skipped."""

    coded: list[Coded] = field(default_factory=list)
    considered: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    cut: int = 0
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The report's `attributes` object."""
        return {"considered": self.considered, "skipped": self.skipped, "cut": self.cut,
                "max_attributes": MAX_ATTRIBUTES, "errors": self.errors}


#: A number's bucket key (`number_keys`): 0 for 0, else sign * BUCKET_SIGN + k + BUCKET_EXP0 for |x| in [2^k, 2^(k+1)),
#: sign 1 positive, 2 negative (the ClickHouse report computes the same keys in SQL).
BUCKET_SIGN: Final = 4096
BUCKET_EXP0: Final = 2048


def number_keys(x: npt.NDArray[np.float64]) -> tuple[I64, bool]:
    """Each number's bucket key (NaN: -1) and whether every number is an integer."""
    ok = ~np.isnan(x)
    ax = np.abs(np.where(ok, x, 0.0))
    _, exp = np.frexp(ax)  # ax = m 2^exp, m in [0.5, 1): k = exp - 1
    k = exp.astype(np.int64) - 1
    sign = np.where(x < 0, 2, np.where(ax == 0, 0, 1))
    key = np.where(ok, sign * BUCKET_SIGN + np.where(sign == 0, 0, k + BUCKET_EXP0), -1)
    integral = bool(np.all(np.equal(np.mod(x[ok], 1), 0))) if ok.any() else True
    return key.astype(np.int64), integral


def number_labels(present: Sequence[int], integral: bool) -> tuple[list[int], list[str], list[int | None],
                                                                   list[int | None]]:
    """The buckets of the keys `present`, in order of value: (their keys in that order, labels, low and high ends).

    When every number is an integer (`integral`), buckets are written as the token buckets are ("lo-hi",
    both ends included, `bucket_label`), else "lo-hi" with hi excluded and lo / hi null."""
    def value_of(c: int) -> float:
        s, kk = divmod(int(c), BUCKET_SIGN)
        return 0.0 if s == 0 else (1.0 if s == 1 else -1.0) * 2.0 ** (kk - BUCKET_EXP0)

    order = sorted((int(c) for c in present), key=value_of)
    labels: list[str] = []
    los: list[int | None] = []
    his: list[int | None] = []
    for c in order:
        v = value_of(c)
        if v == 0:
            labels.append(bucket_label(0, 0) if integral else "0")
            los.append(0 if integral else None)
            his.append(0 if integral else None)
            continue
        lo = abs(v)
        if integral:
            a, b = int(lo), int(2 * lo) - 1
            labels.append(bucket_label(a, b) if v > 0 else f"-({bucket_label(a, b)})")
            los.append(a if v > 0 else -b)
            his.append(b if v > 0 else -a)
        else:
            text = f"{lo:g}-{2 * lo:g}"
            labels.append(text if v > 0 else f"-({text})")
            los.append(None)
            his.append(None)
    return order, labels, los, his


def number_buckets(x: npt.NDArray[np.float64]) -> tuple[I64, list[str], list[int | None], list[int | None]]:
    """Power-of-two bucket codes of numbers (NaN: -1), with each code's label and integer ends.

    0 is its own bucket; x > 0 falls in [2^k, 2^(k+1)); negatives mirror the positives (`number_keys`,
    labels by `number_labels`).
    """
    key, integral = number_keys(x)
    ok = key >= 0
    present = np.unique(key[ok])
    order, labels, los, his = number_labels(present.tolist(), integral)
    lut = {c: i for i, c in enumerate(order)}
    codes = np.full(x.size, -1, dtype=np.int64)
    if present.size:
        table = np.searchsorted(present, key[ok])
        remap = np.array([lut[int(c)] for c in present.tolist()], dtype=np.int64)
        codes[ok] = remap[table]
    return codes, labels, los, his


@dataclass
class Part:
    """A key's values on some of the frame's rows: `positions` (frame positions), `codes` (each one's index into
    `values`; len(values): none) and `values`, distinct (`whole`: every one held by a row); an attribute file's column
    (attribute_values.StoredColumn) is one too, its codes read when asked."""

    positions: npt.NDArray[np.integer[Any]]
    codes: npt.NDArray[np.integer[Any]]
    values: pa.Array
    whole: bool = True


def live_part(positions: I64, values: pa.Array | pa.ChunkedArray) -> Part:
    """The Part of plain values (one per position)."""
    enc = pc.dictionary_encode(values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values)
    d = enc.dictionary
    return Part(positions, to_numpy(enc.indices), d.cast(pa.string()) if not pa.types.is_string(d.type) else d)


AnyPart = Part | StoredColumn

#: Past this many values in all, a key's parts' distinct values are counted by hashing before any merge (an id's
#: hours hold about one value per request: merging their text would cost more than the rest of the key).
HASH_COUNT_FROM: Final = 1 << 15


def _is_whole(part: AnyPart) -> bool:
    return part.rows is None if isinstance(part, StoredColumn) else part.whole


def _used(part: AnyPart) -> tuple[pa.Array, I64 | None]:
    """The part's values held by one of its rows, and their indices into `values` (None: every one)."""
    if _is_whole(part):
        return part.values, None
    held = np.flatnonzero(np.bincount(part.codes, minlength=len(part.values) + 1)[:len(part.values)])
    return part.values.take(from_numpy(held)), held.astype(np.int64)


def count_distinct(values: pa.Array) -> int | None:
    """How many distinct texts `values` holds, by sorting their hashes; None when two different texts share a
    hash (then merge them to count). Exact: equal texts hash alike, and every run of equal hashes is checked
    to hold one text."""
    h = pl.from_arrow(values).hash().to_numpy()  # type: ignore[union-attr]
    hs = np.sort(h)
    same = np.flatnonzero(hs[1:] == hs[:-1])
    if same.size:  # which values share a hash (an id seen in two hours): each pair must hold one text
        order = np.argsort(h, kind="stable")
        if not pc.all(pc.equal(values.take(from_numpy(order[same])), values.take(from_numpy(order[same + 1])))).as_py():
            return None
    return int(len(values) - same.size)


@dataclass
class Merged:
    """A key's parts' held values: how many distinct texts, and (once `merge` ran) the distinct texts with the
    index of each part's held value into them."""

    used: list[tuple[pa.Array, I64 | None]]
    distinct: int
    uniq: pa.Array | None = None
    index: list[I64] | None = None

    def merge(self) -> None:
        """Fill `uniq` and `index`."""
        if self.uniq is not None:
            return
        if len(self.used) == 1:
            self.uniq, self.index = self.used[0][0], [np.arange(len(self.used[0][0]), dtype=np.int64)]
            return
        enc = pc.dictionary_encode(pa.concat_arrays([u for u, _ in self.used]))
        idx = to_numpy(enc.indices).astype(np.int64)
        offs = np.cumsum([0] + [len(u) for u, _ in self.used])
        self.uniq, self.index = enc.dictionary, [idx[offs[i]:offs[i + 1]] for i in range(len(self.used))]
        self.distinct = len(self.uniq)


def merged_values(parts: Sequence[AnyPart]) -> Merged:
    """The distinct values the parts' rows hold, counted (by hashes past HASH_COUNT_FROM values), merged only when
    counting needs it."""
    used = [_used(p) for p in parts]
    total = sum(len(u) for u, _ in used)
    if len(used) == 1:
        return Merged(used, total)
    if total >= HASH_COUNT_FROM:
        got = count_distinct(pa.concat_arrays([u for u, _ in used]))
        if got is not None:
            return Merged(used, got)
    out = Merged(used, 0)
    out.merge()
    return out


def _numbers(used: list[tuple[pa.Array, I64 | None]]) -> list[npt.NDArray[np.float64]] | None:
    """Each part's held values as numbers, or None unless every one parses (Arrow's cast) to a finite number."""
    out = []
    for u, _ in used:
        try:
            pc.cast(u.slice(0, 8), pa.float64())  # text fails on its first values, without parsing the rest
            x = to_numpy(pc.cast(u, pa.float64())) if len(u) else np.zeros(0)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        if not np.all(np.isfinite(x)):
            return None
        out.append(x)
    return out


def code_merged(name: str, parts: Sequence[AnyPart], merged: Merged, n_rows: int, numeric_ok: bool = True,
                numbers: list[npt.NDArray[np.float64]] | None = None) -> tuple[Coded, bool]:
    """A key's parts coded for all `n_rows` rows (-1 where no part has a value): numbers (every value parses,
    `numbers` when already read) bucketed, other values text labels, sorted; (coded, numeric)."""
    if numeric_ok and numbers is None and merged.distinct:
        numbers = _numbers(merged.used)
    if not numeric_ok:
        numbers = None
    per_used: list[I64]
    if numbers is not None:
        xs = np.concatenate(numbers) if numbers else np.zeros(0)
        ucodes, labels, los, his = number_buckets(xs)
        offs = np.cumsum([0] + [x.size for x in numbers])
        per_used = [ucodes[offs[i]:offs[i + 1]] for i in range(len(numbers))]
    else:
        merged.merge()
        assert merged.uniq is not None and merged.index is not None
        texts = merged.uniq.to_pylist()
        order = sorted(range(len(texts)), key=lambda i: texts[i])
        rank = np.empty(len(texts), dtype=np.int64)
        rank[order] = np.arange(len(texts))
        labels = [texts[i] for i in order]
        los = his = [None] * len(labels)
        per_used = [rank[ix] for ix in merged.index]
    totals = np.zeros(len(labels) + 1, dtype=np.int64)  # rows per code, the missing ones last
    luts = []
    for part, (_, held), lut_used in zip(parts, merged.used, per_used, strict=True):
        d = len(part.values)
        lut = np.full(d + 1, -1, dtype=np.int64)  # the last slot: no value
        lut[held if held is not None else slice(0, d)] = lut_used
        luts.append(lut)
        stored = part.counts if isinstance(part, StoredColumn) else None
        per_value = stored if stored is not None else np.bincount(part.codes, minlength=d + 1)[:d]
        totals[:-1] += np.bincount(lut[:d][lut[:d] >= 0], weights=per_value[lut[:d] >= 0],
                                   minlength=len(labels)).astype(np.int64)
    totals[-1] = n_rows - int(totals[:-1].sum())
    # attribute files' columns, each a run of frame positions (a file's are sorted): codes made when read
    if all(isinstance(p, StoredColumn) and int(p.positions[-1]) - int(p.positions[0]) + 1 == p.positions.size
           for p in parts):
        coded: Coded = LazyCoded.of(name, labels, list(los), list(his), n_rows, [
            (int(p.positions[0]), int(p.positions[-1]) + 1, p.codes, lut) for p, lut in zip(parts, luts, strict=True)])
    else:
        codes = np.full(n_rows, -1, dtype=np.int64)
        for part, lut in zip(parts, luts, strict=True):  # (every code indexes `lut`: "clip" spares a copy)
            codes[part.positions] = np.take(lut, part.codes, mode="clip")
        coded = Coded(name, codes, labels, list(los), list(his))
    coded.counts = totals
    return coded, numbers is not None


class LazyCoded(Coded):
    """A coding of runs of frame positions, each with its codes and the table mapping them (an attribute file's
    column per hour): `codes` made when first read, `at` gathers a few rows without making them; a copy
    (dataclasses.replace) is a plain coding."""

    runs: list[Run]
    n_rows: int

    @classmethod
    def of(cls, name: str, labels: list[str], lo: list[int | None], hi: list[int | None], n_rows: int,
           runs: list[Run]) -> LazyCoded:
        """The coding of `n_rows` rows, -1 outside the runs (first position, end, codes, table)."""
        self = cls.__new__(cls)
        self.name, self.labels, self.lo, self.hi = name, labels, lo, hi
        self.attribute, self.source, self.counts = None, "builtin", None
        self.runs, self.n_rows = runs, n_rows
        return self

    def __getattr__(self, item: str) -> Any:
        if item != "codes" or "runs" not in self.__dict__:
            raise AttributeError(item)
        covered = sum(b - a for a, b, _, _ in self.runs) == self.n_rows
        codes = np.empty(self.n_rows, dtype=np.int64) if covered else np.full(self.n_rows, -1, dtype=np.int64)
        for a, b, part, lut in self.runs:
            np.take(lut, part, out=codes[a:b], mode="clip")
        self.codes = codes
        return codes

    def keyed(self, scale: int, plus: I64) -> I64:
        """`Coded.keyed` from the runs (through each run's table times `scale`), without making `codes`."""
        if "codes" in self.__dict__ or "runs" not in self.__dict__:
            return super().keyed(scale, plus)
        missing = len(self.labels)
        covered = sum(b - a for a, b, _, _ in self.runs) == self.n_rows
        out = np.empty(self.n_rows, dtype=np.int64) if covered else np.full(self.n_rows, missing * scale,
                                                                           dtype=np.int64)
        for a, b, part, lut in self.runs:
            np.take(np.where(lut < 0, missing, lut) * scale, part, out=out[a:b], mode="clip")
        out += plus
        return out

    def count_keyed(self, scale: int, plus: I64, cells: int, weights: F64 | None = None) -> tuple[I64, F64 | None]:
        """`Coded.count_keyed` in one pass per run through the C kernel (`count_cells`: the same counts, the sums
        in the same row order), without making a key; numpy's when the kernel is not built."""
        lib = load_kernel()
        if (lib is None or not hasattr(lib, "count_cells") or "codes" in self.__dict__ or "runs" not in self.__dict__
                or any(part.dtype.kind != "i" or part.dtype.itemsize not in (1, 2, 4, 8)
                       for _, _, part, _ in self.runs)):
            return super().count_keyed(scale, plus, cells, weights)
        missing = len(self.labels)
        segments: list[Run] = []
        at = 0
        for a, b, part, lut in sorted(self.runs, key=lambda run: run[0]):  # rows in order, those outside missing
            if a > at:
                segments.append((at, a, np.zeros(a - at, dtype=np.int8), np.full(1, -1, dtype=np.int64)))
            segments.append((a, b, part, lut))
            at = b
        if at < self.n_rows:
            segments.append((at, self.n_rows, np.zeros(self.n_rows - at, dtype=np.int8), np.full(1, -1, np.int64)))
        counts = np.zeros(cells, dtype=np.int64)
        sums = None if weights is None else np.zeros(cells, dtype=np.float64)
        i64, f64 = ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_double)
        for a, b, part, lut in segments:
            codes = np.ascontiguousarray(part)
            table = np.ascontiguousarray(np.where(lut < 0, missing, lut) * scale, dtype=np.int64)
            add = np.ascontiguousarray(plus[a:b], dtype=np.int64)
            w = None if weights is None else np.ascontiguousarray(weights[a:b], dtype=np.float64)
            rc = lib.count_cells(codes.ctypes.data_as(ctypes.c_void_p), codes.dtype.itemsize, b - a,
                                 table.ctypes.data_as(i64), table.size, add.ctypes.data_as(i64),
                                 None if w is None else w.ctypes.data_as(f64), counts.ctypes.data_as(i64),
                                 None if sums is None else sums.ctypes.data_as(f64), cells)
            if rc != 0:  # a code past its table (numpy's "clip" reads the last slot) or a key out of range
                return super().count_keyed(scale, plus, cells, weights)
        return counts, sums

    def at(self, rows: I64) -> I64:
        """The codes of `rows`, gathered from the runs (or from `codes` once made)."""
        if "codes" in self.__dict__ or "runs" not in self.__dict__:
            return self.codes[rows]
        out = np.full(rows.size, -1, dtype=np.int64)
        for a, b, part, lut in self.runs:
            sel = np.flatnonzero((rows >= a) & (rows < b))
            if sel.size:
                out[sel] = np.take(lut, part[rows[sel] - a], mode="clip")
        return out


def code_values(name: str, rows: I64, values: pa.Array, n_rows: int, numeric_ok: bool = True
                ) -> tuple[Coded, int, bool]:
    """A key's values on `rows` (frame positions) coded for all `n_rows` rows (-1 elsewhere): (coded, distinct raw
    values, numeric). Numbers (every value parses) are bucketed; other values are text labels, sorted."""
    parts = [live_part(rows, values)]
    merged = merged_values(parts)
    coded, numeric = code_merged(name, parts, merged, n_rows, numeric_ok)
    return coded, merged.distinct, numeric


def _read_long(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any]) -> pa.Table:
    return con.sql(sql, params=params).to_arrow_table()


#: The request spans' attribute maps are read from the spans for at most about this many requests a query (split by
#: start time): each query's maps, and its distinct values with their rows, are held at once (at 250,000 requests of 40
#: keys, about 500 MiB).
CHUNK_REQUESTS: Final = 100_000


def _chunks(con: duckdb.DuckDBPyConnection, live_rows: str, params: dict[str, Any]) -> list[tuple[Any, Any]]:
    """Start-time ranges [lo, hi) splitting the rows of `live_rows` in [$lo, $hi) into parts of at most about
    CHUNK_REQUESTS rows (each hour's span cut evenly); the whole range where they are no more."""
    hour = HOUR_NS
    got = con.sql(f"SELECT start_ns // {hour} AS h, count(*), min(start_ns), max(start_ns) FROM ({live_rows}) "
                  "WHERE ($lo IS NULL OR start_ns >= $lo) AND ($hi IS NULL OR start_ns < $hi) GROUP BY h ORDER BY h",
                  params=params).fetchall()
    if sum(int(r[1]) for r in got) <= CHUNK_REQUESTS:
        return [(params["lo"], params["hi"])]
    out: list[tuple[Any, Any]] = []
    for _, count, a, b in got:
        k = math.ceil(int(count) / CHUNK_REQUESTS)
        edges = [int(a) + (int(b) + 1 - int(a)) * i // k for i in range(k + 1)]  # integers: ns past float precision
        out += [(x, y) for x, y in itertools.pairwise(edges) if y > x]
    return out


def _in_chunk(source: str, live_rows: str, spans: str, stored: StoredValues | None) -> str:
    """The request attribute SQL of the rows of `live_rows` starting in [$lo, $hi)."""
    rows = f"SELECT * FROM ({live_rows}) WHERE start_ns >= $lo AND start_ns < $hi"
    if stored is not None and stored.live_kept:
        return AV.live_values_sql(source, rows)
    return AV.request_attribute_sql(rows, spans)


def _live_part(positions: npt.NDArray[np.integer[Any]], codes: npt.NDArray[np.integer[Any]], values: pa.Array | None
               ) -> Part:
    """The Part of `split_grouped`'s rows of a key at frame `positions` (a presence-only key: no value), one value per
    position (the request SQL reads one copy of a request span stored twice)."""
    return Part(positions, codes, values if values is not None else pa.nulls(0, pa.string()), True)


class _Positions:
    """Frame positions of row ids (every id must be a frame row's): a table indexed by id where the ids are dense
    (the live facts' rows are numbered from 0), else the frame's ids sorted once and searched."""

    def __init__(self, frame_rid: I64) -> None:
        self.kind = np.int32 if frame_rid.size < 2**31 else np.int64
        lo, hi = (int(frame_rid.min()), int(frame_rid.max())) if frame_rid.size else (0, -1)
        self.lo = lo
        self.table: npt.NDArray[np.integer[Any]] | None = None
        if hi - lo < 4 * frame_rid.size + 1024:  # a table of at most a few entries a row
            self.table = np.zeros(hi - lo + 1, dtype=self.kind)
            self.table[frame_rid - lo] = np.arange(frame_rid.size, dtype=self.kind)
        else:
            self.order = np.argsort(frame_rid, kind="stable")
            self.sorted = frame_rid[self.order]

    def __call__(self, rid: I64) -> npt.NDArray[np.integer[Any]]:
        """int32 where the frame allows: every key of every request holds one (at 10 M spans, 40 keys of 1.4 M)."""
        if self.table is not None:
            return self.table[rid - self.lo]
        return self.order[np.searchsorted(self.sorted, rid)].astype(self.kind)


def _same_partition(a: Coded, b: Coded) -> bool:
    """Whether two codings split rows into the same groups (missing alike); every label of `a` is used."""
    if len(a.labels) != len(b.labels):
        return False
    # no row missing in either (their counts say so without a pass): nothing to compare but the values
    whole = counts_of(a)[-1] == 0 and counts_of(b)[-1] == 0
    if not whole and not np.array_equal(a.codes < 0, b.codes < 0):
        return False
    if whole and len(a.labels) == 1:
        return True  # one group each, every row in it
    ok = a.codes >= 0
    if not ok.any():
        return True
    # a's value decides b's (one pair per value of a): with as many values each, the same groups
    ac, bc = (a.codes, b.codes) if whole else (a.codes[ok], b.codes[ok])
    b_of = np.full(len(a.labels), -1, dtype=np.int64)
    b_of[ac] = bc
    return bool(np.array_equal(b_of[ac], bc))


def _group_sizes(coded: Coded) -> tuple[int, ...]:
    """The rows missing, then the sizes of a coding's groups, sorted: equal for two codings of the same partition
    (a cheap look before comparing rows)."""
    counts = counts_of(coded)  # missing last; the groups up to the last one held (as a count of codes + 1 gives)
    held = np.flatnonzero(counts[:-1])
    return (int(counts[-1]), *sorted(counts[:int(held[-1]) + 1 if held.size else 0].tolist()))


class Judge:
    """Applies the skip rules to each key, in the order of SKIP_REASONS; keeps what is left."""

    def __init__(self, n_rows: int, rules: AttributeRules, builtin: Sequence[Coded]) -> None:
        self.n = n_rows
        self.rules = rules
        self.builtin = builtin
        self.bound = min(MAX_VALUES, max(MIN_PRESENT, math.floor(MAX_VALUE_SHARE * n_rows)))
        self.out = Attributes()
        self.taken: dict[str, str] = {}
        self.sizes: dict[int, tuple[int, ...]] = {}

    def _sizes(self, coded: Coded) -> tuple[int, ...]:
        """`_group_sizes` of a dimension kept (a built-in or an attribute taken: alive while the judge is)."""
        got = self.sizes.get(id(coded))
        if got is None:
            got = self.sizes[id(coded)] = _group_sizes(coded)
        return got

    def skip(self, key: str, source: str, reason: str, why: str) -> None:
        self.out.skipped.append({"attribute": key, "source": source, "reason": reason, "why": why})

    def before_coding(self, key: str, source: str, present: int) -> bool:
        """The rules read before a key's values are coded; True when it goes on."""
        if key in BUILTIN_KEYS:
            self.skip(key, source, "builtin", f"read as the built-in dimension {BUILTIN_KEYS[key]!r}")
            return False
        if key.startswith(_OWN_PREFIX):
            self.skip(key, source, "tailscope", "tailscope's own key (the convention's bookkeeping)")
            return False
        timing = timing_pattern(key)
        if timing is not None:
            self.skip(key, source, "timing", f"records the request's own timing ({timing!r}): the latency is the "
                      "effect being explained, not a cause")
            return False
        if key in {c.name for c in self.builtin} or key in {"replica"}:
            self.skip(key, source, "builtin", "has the name of a built-in dimension")
            return False
        why = self.rules.ruled_out(key)
        if why is not None:
            self.skip(key, source, "pattern", why)
            return False
        if key in self.taken:
            self.skip(key, source, "shadowed", f"also a {self.taken[key]} attribute, which is the one used")
            return False
        least = max(MIN_PRESENT, math.ceil(MIN_PRESENCE * self.n))
        if present < least:
            self.skip(key, source, "rare", f"on {present} of {self.n} requests (fewer than {least}: "
                      f"{MIN_PRESENCE:.0%} of the window's requests, at least {MIN_PRESENT})")
            return False
        return True

    def cut_past(self, key: str, source: str, why: str) -> bool:
        """True (and the key skipped as cut, and counted) when MAX_ATTRIBUTES dimensions are kept already."""
        if len(self.out.coded) < MAX_ATTRIBUTES:
            return False
        self.out.cut += 1
        self.skip(key, source, "cut", f"past the first {MAX_ATTRIBUTES} attribute dimensions{why}")
        return True

    def ids(self, key: str, source: str, present: int, distinct: int) -> bool:
        """Whether a key is skipped as ids (about one value per request carrying it): read before its coding."""
        if distinct >= UNIQUE_SHARE * present and distinct > 1:
            self.skip(key, source, "ids", f"{distinct} distinct values on {present} requests: about one per "
                      f"request (at least {UNIQUE_SHARE:.0%}), an id or free text")
            return True
        return False

    def after_coding(self, coded: Coded, source: str, present: int, distinct: int, numeric: bool,
                     same_partition: Callable[[Coded, Coded], bool] | None = None) -> None:
        """The rules read from a key's coded values; keeps it (as a candidate) when none applies.

        `same_partition(coded, other)`: whether they split the frame's requests alike (default: over their
        codes, group sizes first; a remote engine, whose codes stay on the server, asks it)."""
        key = coded.name
        if self.ids(key, source, present, distinct):
            return
        if not numeric and distinct > self.bound:
            self.skip(key, source, "cardinality", f"{distinct} distinct values, over the bound {self.bound} "
                      f"({MAX_VALUE_SHARE:.0%} of the window's {self.n} requests, at most {MAX_VALUES})")
            return
        mine = _group_sizes(coded) if same_partition is None else ()
        for other in [*self.builtin, *self.out.coded]:
            if (same_partition(coded, other) if same_partition is not None
                    else mine == self._sizes(other) and _same_partition(coded, other)):
                self.skip(key, source, "same_partition", f"splits the requests exactly as {other.name!r} does")
                return
        coded.attribute, coded.source = key, source
        self.taken[key] = source
        self.out.coded.append(coded)
        self.out.considered.append({"attribute": key, "source": source, "kind": "number" if numeric else "text",
                                    "values": len(coded.labels), "requests": present})


def read_attributes(con: duckdb.DuckDBPyConnection, facts_rows: str, params: dict[str, Any], frame_rid: I64,
                    replica: Coded | None, builtin: Sequence[Coded], rules: AttributeRules,
                    since_ns: int | None, until_ns: int | None, stored: StoredValues | None = None) -> Attributes:
    """The attribute dimensions of the frame's rows (`frame_rid`: their facts row ids, `facts_rows`: a query of
    those facts rows with rid, trace_id, span_id, start_ns; `params` its parameters), from the connection's `spans`.

    `replica`: the frame's replica dimension (the resource attributes are the replica's); `builtin`: the built-in
    dimensions coded (a key splitting requests as one of them does is skipped); `stored`: the request and stage
    values of the rows of materialized hours (analysis.engine.attribute_values), the other rows read from the
    spans: the same values either way. A key is judged by the rules that need no code first (the ids rule from
    its distinct values alone), and coded only when it may be kept."""
    n = frame_rid.size
    judge = Judge(n, rules, builtin)
    p = {**params, "lo": since_ns, "hi": until_ns}
    live_rows = facts_rows if stored is None else f"SELECT * FROM ({facts_rows}) WHERE {stored.live_where}"
    spans = "spans" if stored is None else stored.live_spans  # the stale hours' segments only, where that is all
    for source, sql in (("request", request_attribute_sql(live_rows, spans)),
                        ("stage", stage_attribute_sql(live_rows, spans))):
        if stored is not None and stored.live_kept:  # the stale hours' values the reader keeps (keep_live_values)
            sql = AV.live_values_sql(source, live_rows)
        live_parts: dict[str, list[Part]] = {}  # from the spans
        if stored is None or not stored.all_stored:
            at = _Positions(frame_rid)
            try:
                # the request spans' maps a share of the requests at a time (by start time); a stage key's value
                # reads spans beside the request's hour, and they are few: those in one pass
                chunks = _chunks(con, live_rows, p) if source == "request" else [(since_ns, until_ns)]
                for lo, hi in chunks:
                    rows = sql if len(chunks) == 1 else _in_chunk(source, live_rows, spans, stored)
                    got = split_grouped(_read_long(con, AV.grouped_sql(rows, source), {**p, "lo": lo, "hi": hi}))
                    for k, (rids, codes, values) in got.items():
                        live_parts.setdefault(k, []).append(_live_part(at(rids), codes, values))
            except duckdb.Error as exc:
                judge.out.errors.append(f"could not read the {source} attributes because {str(exc).splitlines()[0]}")
                continue
        kept = stored.by_source.get(source, {}) if stored is not None else {}  # attribute files' columns
        present = {k: sum(int(v.positions.size) for v in vs) for k, vs in live_parts.items()}
        for k, cols in kept.items():
            present[k] = present.get(k, 0) + sum(c.present for c in cols)
        # a key of a stored hour that none of the frame's rows carries is not a key of these requests
        for key in sorted((k for k in present if present[k]), key=lambda k: (-present[k], k)):
            if not judge.before_coding(key, source, present[key]) or judge.cut_past(key, source, CUT_PRESENT):
                live_parts.pop(key, None)
                continue
            parts: list[AnyPart] = [c for c in kept.get(key, []) if c.present]
            parts[:0] = live_parts.pop(key, [])  # a key judged lets its values go
            merged = merged_values(parts)
            if judge.ids(key, source, present[key], merged.distinct):  # before its labels are made: ids have many
                continue
            numbers = _numbers(merged.used) if merged.distinct else None
            if numbers is None and merged.distinct > judge.bound:  # text of too many values: never coded
                judge.after_coding(Coded(key, np.zeros(0, dtype=np.int64), [], [], []), source, present[key],
                                   merged.distinct, False)
                continue
            coded, numeric = code_merged(key, parts, merged, n, numbers=numbers)
            judge.after_coding(coded, source, present[key], merged.distinct, numeric)
    if replica is not None and replica.labels:
        try:
            _resource(con, p, replica, judge, stored)
        except duckdb.Error as exc:
            judge.out.errors.append(f"could not read the resource attributes because {str(exc).splitlines()[0]}")
    return judge.out


def _resource(con: duckdb.DuckDBPyConnection, params: dict[str, Any], replica: Coded, judge: Judge,
              stored: StoredValues | None) -> None:
    """The resource attributes of each request's replica, as dimensions (through a table over the replicas); the
    materialized hours' replicas' values from their files (`stored`), the others' from the spans."""
    found = resource_rows(con, stored, params["lo"], params["hi"])
    at = {label: i for i, label in enumerate(replica.labels)}
    per_key: dict[str, list[str | None]] = {}
    for rep, key, vs in found:
        if rep not in at:
            continue
        per_key.setdefault(str(key), [None] * len(replica.labels))[at[rep]] = vs[0] if len(vs) == 1 else None
    # each request's replica code, the missing ones the tables' last slot: a key's rows are read through a table of
    # the replicas carrying it (one gather, not a pass over the requests per replica)
    slot = np.where(replica.codes >= 0, replica.codes, len(replica.labels))
    # a key's rows per value are its replicas' rows (the replica's counts, missing last as `slot`): no pass per key
    per_replica = counts_of(replica)
    for key in sorted(per_key, key=lambda k: (-sum(v is not None for v in per_key[k]), k)):
        table = per_key[key]
        rep_codes = np.flatnonzero([v is not None for v in table])
        present = int(per_replica[rep_codes].sum())
        if not judge.before_coding(key, "resource", present):
            continue
        if judge.cut_past(key, "resource", ""):
            continue
        values = strings([str(table[int(r)]) for r in rep_codes])
        small, distinct, numeric = code_values(key, np.arange(rep_codes.size, dtype=np.int64), values,
                                               rep_codes.size)
        lut = np.full(len(replica.labels) + 1, -1, dtype=np.int64)
        lut[rep_codes] = small.codes
        codes = lut[slot]
        coded = Coded(key, codes, small.labels, small.lo, small.hi)
        missing_last = np.where(lut >= 0, lut, len(small.labels))
        coded.counts = np.bincount(missing_last, weights=per_replica, minlength=len(small.labels) + 1
                                   ).astype(np.int64)
        judge.after_coding(coded, "resource", present, distinct, numeric)


#: A coarser value is named over a finer one nested in it only when it explains this much more of the excess.
HIERARCHY_MARGIN: Final = 0.1
#: Float rounding of a difference of shares (two scores' difference is 0 when their shares' are): far below any
#: share that means anything.
SHARE_ROUNDING: Final = 1e-9


def _subset(a: npt.NDArray[np.bool_], b: npt.NDArray[np.bool_]) -> bool:
    return bool(a.any()) and not bool((a & ~b).any())


def earns_nothing(coarse: Any, coarse_mask: npt.NDArray[np.bool_], fine: Any, fine_mask: npt.NDArray[np.bool_]) -> bool:
    """Whether `coarse` strictly holds `fine` and its other requests are no more frequent in the tail than in the
    baseline: the contrast score of coarse minus fine (its `score` less fine's, the two nested) at most 0 (up to
    SHARE_ROUNDING). Such a coarser value's extra `explained` comes from removing ordinary requests with the cause
    (a smaller set's p99), not from a cause of its own."""
    return _subset(fine_mask, coarse_mask) and not np.array_equal(fine_mask, coarse_mask) \
        and coarse.score - fine.score <= SHARE_ROUNDING


def named_at(value: Any, others: Sequence[Any]) -> bool:
    """Whether `value` explains as much as each of `others` within HIERARCHY_MARGIN, `explained` capped at 1: a value
    whose removal takes away the whole excess explains all there is (past 1, a coarser value only removes more of the
    ordinary tail with it)."""
    own = min(value.explained, 1.0)
    return all(own >= min(o.explained, 1.0) - HIERARCHY_MARGIN for o in others)


def folded_under(ranked: Sequence[Any]) -> list[int | None]:
    """For each of `ranked` (best first), the position of the value a pair folds under, else None: the better
    (by `explained`) of its two parts ranked before it, when that part explains as much as the pair within
    HIERARCHY_MARGIN (`named_at`, the hierarchy's rule): such a pair restates its part for the reader."""
    at = {(c.dims[0], c.codes[0]): n for n, c in enumerate(ranked) if len(c.dims) == 1}
    out: list[int | None] = []
    for n, c in enumerate(ranked):
        parts = [at[(d, v)] for d, v in zip(c.dims, c.codes, strict=True)
                 if len(c.dims) == 2 and at.get((d, v), n) < n]
        parts = [p for p in parts if math.isfinite(ranked[p].explained)]
        if not parts or not math.isfinite(c.explained):
            out.append(None)
            continue
        best = min(parts, key=lambda p: (-min(ranked[p].explained, 1.0), p))
        out.append(best if named_at(ranked[best], [c]) else None)
    return out


#: A nesting test's counts: (the dimensions, single candidates `a`, single candidates `b`) -> (each of `a`'s requests,
#: for each of `a` the requests it shares with each of `b`), over the frame's requests (`local_overlap`, or a remote
#: engine's counts over its frame).
Overlap = Callable[[Sequence[Coded], list[Any], list[Any]], tuple[list[int], list[list[int]]]]


def local_overlap(coded: Sequence[Coded], a: list[Any], b: list[Any]) -> tuple[list[int], list[list[int]]]:
    """`Overlap` over the codes of `coded` (every row of the frame)."""
    def mask(c: Any) -> npt.NDArray[np.bool_]:
        return np.asarray(coded[c.dims[0]].codes == c.codes[0])

    mb = [mask(c) for c in b]
    sizes, both = [], []
    for c in a:
        m = mask(c)
        sizes.append(int(m.sum()))
        both.append([int((m & x).sum()) for x in mb])
    return sizes, both


def name_level(coded: Sequence[Coded], ranked: list[Any], overlap: Overlap | None = None
               ) -> tuple[list[Any], list[Any], list[Any]]:
    """The level of a learned hierarchy the first candidate names: (candidates reordered, finer, coarser).

    The single candidates nested with the first one (every request of one carries the other's value, over
    the frame's rows: replica in node, node in zone) form its chain; the value named is the finest of the
    chain explaining as much as any (`named_at`), leaving out the coarser values that hold it and earn nothing
    (`earns_nothing`: their other requests are not over-represented in the tail); the finer ones are shown
    under it. Of values selecting exactly the same requests, the one of the dimension with fewer values comes first.
    `overlap`: the nesting test's counts (default `local_overlap`, over `coded`'s rows; a remote engine's).
    """
    if not ranked or len(ranked[0].dims) != 1:
        return ranked, [], []
    count = overlap or local_overlap
    singles = [i for i, c in enumerate(ranked) if len(c.dims) == 1]
    sizes, both = count(coded, [ranked[i] for i in singles], [ranked[0]])
    n = dict(zip(singles, sizes, strict=True))
    with_top = {i: row[0] for i, row in zip(singles, both, strict=True)}
    n_top = n[0]

    def same(i: int) -> bool:  # the very requests of the first
        return n[i] == with_top[i] == n_top

    # values selecting exactly the same requests (the small zone's one node, the zone): the coarser dimension's
    first = min((i for i in singles if same(i)), key=lambda i: (len(coded[ranked[i].dims[0]].labels), i))
    members = [first] + [i for i in singles[1:] if math.isfinite(ranked[i].explained) and not same(i) and (
        (n[i] > 0 and with_top[i] == n[i]) or (n_top > 0 and with_top[i] == n_top))]  # inside the first or around it
    order = [first, *(i for i in range(len(ranked)) if i != first)]
    ranked = [ranked[i] for i in order]
    if len(members) == 1 or not math.isfinite(ranked[0].explained):
        return ranked, [], []
    at = {old: new for new, old in enumerate(order)}
    m_sizes, inter = count(coded, [ranked[at[i]] for i in members], [ranked[at[i]] for i in members])
    size = {at[i]: m_sizes[k] for k, i in enumerate(members)}
    shared = {(at[i], at[j]): inter[k][h] for k, i in enumerate(members) for h, j in enumerate(members)}

    def earns(coarse: int, fine: int) -> bool:  # earns_nothing over the counts: fine strictly inside coarse, ...
        inside = size[fine] > 0 and shared[(fine, coarse)] == size[fine] and size[coarse] > size[fine]
        return not (inside and ranked[coarse].score - ranked[fine].score <= SHARE_ROUNDING)

    chain = sorted((size[at[i]], at[i]) for i in members)
    pos = next(j for j, (_, i) in enumerate(chain)
               if named_at(ranked[i], [ranked[o] for _, o in chain if o != i and earns(o, i)]))
    named = chain[pos][1]
    finer = sorted((ranked[i] for _, i in chain[:pos]), key=lambda c: -c.explained)
    coarser = [ranked[i] for _, i in chain[pos + 1:]]
    return [ranked[named], *(c for i, c in enumerate(ranked) if i != named)], finer, coarser
