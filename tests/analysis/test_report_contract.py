"""Real reports conform to analysis.contract's types, and every key of those types is documented.

The checker below reads the TypedDicts' annotations (required and NotRequired keys, unions, lists,
dicts, nested TypedDicts) and walks a report: a missing required key, an unknown key, or a value of
the wrong type fails with the path to it. docs/methods.md's contract table must name every key.
"""

from __future__ import annotations

import json
import re
import types
import typing
from pathlib import Path
from typing import Any, NotRequired, Union, get_args, get_origin, get_type_hints

import pytest

from analysis import build_report, connect
from analysis import contract as K
from analysis.report import explain_window
from tests import samples_cache
from tests.analysis.test_report import SPIKE_WINDOWS, clean_fleet_store, fleet_store
from tests.factory import T0

ROOT = Path(__file__).resolve().parents[2]
SEC = 1_000_000_000


def _is_typeddict(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__required_keys__")


def problems(value: Any, tp: Any, path: str = "$") -> list[str]:
    """Where `value` does not conform to the type `tp` (empty when it does)."""
    origin = get_origin(tp)
    if tp is Any:
        return []
    if origin in (Union, types.UnionType):
        found = [problems(value, arm, path) for arm in get_args(tp)]
        return [] if any(not f for f in found) else [f"{path}: {value!r} is none of {tp}"]
    if tp is type(None):
        return [] if value is None else [f"{path}: {value!r} is not null"]
    if _is_typeddict(tp):
        if not isinstance(value, dict):
            return [f"{path}: {type(value).__name__} is not an object ({tp.__name__})"]
        hints = get_type_hints(tp)
        out = [f"{path}: missing {k!r} ({tp.__name__})" for k in sorted(tp.__required_keys__ - value.keys())]
        out += [f"{path}: unknown key {k!r} ({tp.__name__})" for k in sorted(value.keys() - hints.keys())]
        for k in value.keys() & hints.keys():
            out += problems(value[k], hints[k], f"{path}.{k}")
        return out
    if origin is list:
        if not isinstance(value, list):
            return [f"{path}: {value!r} is not a list"]
        return [p for i, v in enumerate(value) for p in problems(v, get_args(tp)[0], f"{path}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{path}: {value!r} is not an object"]
        key_t, val_t = get_args(tp)
        return [p for k, v in value.items() for p in problems(k, key_t, path) + problems(v, val_t, f"{path}.{k}")]
    if tp is float:  # JSON: an integral float may read back as an int
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return [] if ok else [f"{path}: {value!r} is not a number"]
    if tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        return [] if ok else [f"{path}: {value!r} is not an integer"]
    return [] if isinstance(value, tp) else [f"{path}: {value!r} is not {tp.__name__}"]


def contract_keys(tp: Any = K.Report, seen: set[Any] | None = None) -> set[str]:
    """Every key of the contract's types, reached from `tp`."""
    seen = set() if seen is None else seen
    if tp in seen:
        return set()
    seen.add(tp)
    keys: set[str] = set()
    if _is_typeddict(tp):
        for k, v in get_type_hints(tp).items():
            keys.add(k)
            keys |= contract_keys(v, seen)
    for arm in get_args(tp):
        keys |= contract_keys(arm, seen)
    return keys


def test_checker_catches_each_kind_of_mismatch() -> None:
    good = {"dimension": "replica", "value": "r1", "lo": None, "hi": None, "attribute": None, "source": "builtin"}
    assert problems(good, K.Condition) == []
    assert problems({**good, "lo": "x"}, K.Condition) == ["$.lo: 'x' is none of int | None"]
    assert problems({k: v for k, v in good.items() if k != "value"}, K.Condition) == [
        "$: missing 'value' (Condition)"]
    assert problems({**good, "extra": 1}, K.Condition) == ["$: unknown key 'extra' (Condition)"]
    assert problems({"a": 1.5}, dict[str, int]) == ["$.a: 1.5 is not an integer"]
    assert problems([True], list[int]) == ["$[0]: True is not an integer"]
    assert problems(3, float) == []
    assert get_origin(typing.get_type_hints(K.Dimension, include_extras=True)["support_weighted"]) is NotRequired


@pytest.fixture(scope="module")
def spiky(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return samples_cache.built("fleet-spiky", fleet_store, tmp_path_factory)


def test_reports_conform_to_the_contract(spiky: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    con = connect(spiky)
    report = json.loads(json.dumps(build_report(con)))  # as `--json` prints it
    assert report["spikes"] and report["spikes"][0]["dimensions"], "the fixture's spike must be explained"
    assert problems(report, K.Report) == []
    clean_store = samples_cache.built("fleet-clean", clean_fleet_store, tmp_path_factory)
    clean = json.loads(json.dumps(build_report(connect(clean_store))))
    assert clean["spikes"] == [] and problems(clean, K.Report) == []
    start, end = T0 + SPIKE_WINDOWS[0] * 60 * SEC, T0 + (SPIKE_WINDOWS[-1] + 1) * 60 * SEC
    item = json.loads(json.dumps(explain_window(con, start, end)))
    assert problems(item, K.Spike) == []


def test_every_contract_key_is_documented() -> None:
    text = (ROOT / "docs" / "methods.md").read_text()
    table = text[text.index("## `tailscope report --json`: the contract"):]
    documented = set(re.findall(r"`(?:spikes\[\]\.(?:dimensions\[\]\.)?|\.)?([a-z_0-9]+)`", table))
    missing = sorted(contract_keys() - documented)
    assert not missing, f"keys of analysis.contract that docs/methods.md's contract table does not name: {missing}"
