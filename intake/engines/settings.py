"""Settings of the engine mappers: the `ENGINES` table owns their names, defaults, variables and help."""

from __future__ import annotations

from typing import Final

from tracing.settings import Setting, SettingsTable


class EngineSettings(SettingsTable):
    """Settings of the serving-engine trace readers (docs/engines.md)."""

    title = "Engine trace readers (`tailscope ingest`, `tailscope collect`)"
    intro = ("Read by the engine mappers when a file is ingested: the environment variable, else the "
             "default. A malformed value rejects the file with one line naming the variable.")
    readers = ("intake.engines.triton",)

    triton_clock_offset_ns: Setting[int | None] = Setting(
        int, None, "wall-clock ns minus monotonic ns added to the `ns` timestamps of a Triton JSON trace file "
        "(measure it on the server as `date +%s%N` minus the CLOCK_MONOTONIC reading)",
        env="TAILSCOPE_TRITON_CLOCK_OFFSET_NS", default_doc="the file's mtime minus its latest timestamp")


#: The engine mappers' settings table.
ENGINES: Final = EngineSettings()
