"""`tailscope compact`: merge a store's small segments into a few large sorted files, and apply retention."""

from __future__ import annotations

import inspect
import sys
from typing import Any

import typer

from intake.collect.config import COLLECT, COMPACT_SETTINGS, CollectConfig
from tailscope.commands.collect import setting_options, setting_values
from tailscope.commands.common import StoreOption, errors_as_messages, fail, say, store_hooks, store_path

#: Third-party packages the command needs.
NEEDS = ("pyarrow", "duckdb")


def compact(store: StoreOption = None, **options: Any) -> None:
    """Compact a store once (any store: written by collect, ingest or a serving process) and apply retention.

    While an hour is written its segments are merged in levels; a settled hour (ended
    --compact-settle-s ago, no new segment for --compact-quiet-s) ends as a few large files
    sorted by start time. Merged segments stay hidden on disk for --compact-grace-s (readers that
    listed them may finish) and are deleted by a later run. A running `tailscope collect`
    compacts its store already (one compactor per store).
    """
    from intake.compact.merge import make_compactor

    try:
        config = CollectConfig(store=store_path(store), **setting_values(COLLECT, options))
        policy, keep = config.compact_policy(), config.retention()
    except ValueError as exc:
        fail(str(exc))
    with errors_as_messages():
        on_removed, extra_bytes = store_hooks(config.store)
        compactor = make_compactor(config.store, policy, keep, say=say, on_removed=on_removed,
                                   extra_bytes=extra_bytes)
        with compactor:
            r = compactor.run_once()
    removed = f", {len(r.removed_hours)} hour(s) removed by retention ({keep.describe()})" if r.removed_hours else ""
    pending = f"; {r.pending_hours} settled hour(s) still to merge" if r.pending_hours else ""
    sys.stderr.write(f"compact: {r.merges} merge(s) of {r.merged_segments:,} segments ({r.written_spans:,} spans "
                     f"written), {r.deleted:,} merged segment(s) deleted{removed}; now {r.files:,} segment(s) "
                     f"in {r.hours} hour(s), at most {r.max_files_per_hour} in one{pending}\n")
    if r.failed:
        raise typer.Exit(1)


compact.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [next(iter(inspect.signature(compact, eval_str=True).parameters.values())),
     *setting_options(COLLECT, COMPACT_SETTINGS)])
compact.__annotations__ = {p.name: p.annotation for p in compact.__signature__.parameters.values()}  # type: ignore[attr-defined]


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("compact")(compact)
