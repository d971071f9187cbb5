"""Map native traces of serving engines (vLLM, SGLang, TGI, Triton) onto the request model."""

from __future__ import annotations

import pyarrow as pa


def normalize(table: pa.Table) -> pa.Table:
    """Return `table` with engine-native spans mapped onto stages (identity until engines land)."""
    return table


def read_json_array(path: object, data: bytes, *, skip_bad: bool, report: object) -> list[pa.Table]:
    """Decode a JSON-array trace file (Triton's trace file format)."""
    from tracing.errors import InputError

    raise InputError(str(path), 1, "JSON array trace files (Triton) are not readable yet")
