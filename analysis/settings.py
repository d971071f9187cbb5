"""Settings of the analysis: the `EXPLAIN` table owns the names, defaults, variables and help of the report's
dimension rules (read by `analysis.report`; docs/settings.md is generated from it)."""

from __future__ import annotations

from typing import Final

from tracing.settings import Setting, SettingsTable


class ExplainSettings(SettingsTable):
    """Which dimensions the report's explanation considers."""

    title = "Report dimensions (`tailscope report`, the dashboard, `watch`)"
    intro = ("Read by `analysis.report` for every explanation: the command-line option (`report --dimensions`, "
             "`--exclude-dimensions`) if given, else the environment variable, else the default. Patterns are "
             "shell globs on dimension names: attribute keys as they appear in the traces "
             "(`k8s.node.name`, `gen_ai.*`) or the built-in names (`replica`, `tenant`, ...); the exclusions "
             "of the variable apply even when the option is given (docs/methods.md#dimensions).")
    readers = ("analysis.report",)

    dimensions: Setting[str] = Setting(
        str, "", "comma-separated glob patterns: only the dimensions matching one are considered (empty: every "
        "one)", env="TAILSCOPE_DIMENSIONS", default_doc="every dimension")
    exclude_dimensions: Setting[str] = Setting(
        str, "", "comma-separated glob patterns of dimensions never considered (ids the rules do not catch, "
        "say)", env="TAILSCOPE_EXCLUDE_DIMENSIONS", default_doc="none")


#: The analysis' settings table.
EXPLAIN: Final = ExplainSettings()
