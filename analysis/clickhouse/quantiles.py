"""The quantile rules in ClickHouse SQL (percentiles.weighted_quantile_sorted), one owner for every pushed-down
figure.
"""

from __future__ import annotations


def q_sql(sorted_values: str, q: float) -> str:
    """The quantile q of a sorted array by percentiles.weighted_quantile_sorted's unweighted arithmetic, step for step
    in Float64 (rank h = (n - 1) q, linear interpolation): equal to numpy's and DuckDB's to the last bit."""
    n = f"length({sorted_values})"
    h = f"(({n} - 1) * {q!r})"
    lo = f"toUInt64(floor({h}))"
    a = f"{sorted_values}[{lo} + 1]"
    return f"if({n} = 0, nan, {a} + ({h} - floor({h})) * ({sorted_values}[least({lo} + 1, {n} - 1) + 1] - {a}))"


def wq_sql(values: str, cum: str, q: float) -> str:
    """The weighted quantile q (percentiles.weighted_quantile_sorted): `values` sorted, `cum` their running weight;
    nan when empty."""
    n = f"length({values})"
    h = f"((arrayElement({cum}, -1) - 1) * {q!r})"

    def at(level: str) -> str:  # the first value whose running weight exceeds `level` (the last past the end)
        first = f"arrayFirstIndex(c -> c > {level}, {cum})"
        return f"{values}[if({first} = 0, {n}, {first})]"
    a, b = at(f"floor({h})"), at(f"floor({h}) + 1")
    return f"if({n} = 0, nan, {a} + ({h} - floor({h})) * ({b} - {a}))"


def arrays_sql(value: str, weight: str | None, keep: str | None = None, prefix: str = "") -> str:
    """Aggregates over a group: `{prefix}s` its values sorted, `{prefix}cum` their running weight (when weighted),
    `{prefix}tot` / `{prefix}sq` the sums of the weights and of their squares (the count twice, unweighted).

    `keep` (a condition) narrows the values to its rows that have one, so several metrics or filters share one
    GROUP BY; without it the group's non-null values (the rows' WHERE chooses them)."""
    s, cum, tot, sq = (f"{prefix}{n}" for n in ("s", "cum", "tot", "sq"))
    if keep is None:
        vals = f"groupArray(toFloat64({value}))"
        pairs = f"groupArray((toFloat64({value}), toFloat64({weight})))"
    else:
        cond = f"{value} IS NOT NULL AND ({keep})"
        vals = f"groupArrayIf(toFloat64(assumeNotNull({value})), {cond})"
        pairs = f"groupArrayIf((toFloat64(assumeNotNull({value})), toFloat64({weight})), {cond})"
    if weight is None:
        return f"arraySort({vals}) AS {s}, toFloat64(length({s})) AS {tot}, {tot} AS {sq}"
    p = f"arraySort(x -> x.1, {pairs})"
    return (f"arrayMap(x -> x.1, {p}) AS {s}, arrayMap(x -> x.2, {p}) AS {prefix}ws, arrayCumSum({prefix}ws) AS {cum}, "
            f"arraySum({prefix}ws) AS {tot}, arraySum(arrayMap(x -> x * x, {prefix}ws)) AS {sq}")


def quantile_sql(weight: str | None, q: float, prefix: str = "") -> str:
    """The quantile q over `arrays_sql`'s aggregates (same `prefix`): `q_sql` unweighted, `wq_sql` weighted."""
    return q_sql(f"{prefix}s", q) if weight is None else wq_sql(f"{prefix}s", f"{prefix}cum", q)


def kish_sql(weight: str, cond: str = "TRUE") -> str:
    """Kish's effective count (sum w)^2 / sum w^2 of the rows where `cond` holds, 0 when none (percentiles.
    effective_count; breakdowns._n_effective's arithmetic)."""
    w = f"toFloat64({weight})"
    return f"if(sumIf({w} * {w}, {cond}) = 0, 0, pow(sumIf({w}, {cond}), 2) / sumIf({w} * {w}, {cond}))"
