"""The compactor's policy (its settings are the `compact_*` entries of intake.collect.config.COLLECT).

Kept apart from the merge code so that reading the settings imports no pyarrow.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True)
class Policy:
    """How the compactor shapes an hour (the `compact_*` settings of intake.collect.config.COLLECT)."""

    fan_in: int = 8
    target_bytes: int = 64 * MIB
    settle_s: float = 300.0
    quiet_s: float = 60.0
    grace_s: float = 600.0
    row_group_spans: int = 65_536
    retry_s: float = 30.0
    durable: bool = True
    #: memory the merges may use together, all told (DuckDB gets this less intake.compact.merge.DUCKDB_OVERHEAD_MIB
    #: as its memory_limit; sorts beyond it spill to disk)
    memory_mib: int = 192
    #: merges that may run at once in the background (`Compactor.run`): a fast lane for the lowest levels
    lanes: int = 2

    def __post_init__(self) -> None:
        if self.fan_in < 2:
            raise ValueError(f"compact fan-in must be at least 2, got {self.fan_in}")
        if self.target_bytes <= 0 or self.row_group_spans <= 0:
            raise ValueError("compact target size and row group spans must be positive")
        if self.memory_mib < 128 or self.lanes < 1:
            raise ValueError(f"compact memory must be at least 128 MiB and lanes at least 1, got "
                             f"{self.memory_mib} MiB, {self.lanes}")
        if min(self.settle_s, self.quiet_s, self.grace_s, self.retry_s) < 0:
            raise ValueError("compact times must be >= 0")
