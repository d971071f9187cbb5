"""Settings of the analysis: the `EXPLAIN` table owns the names, defaults, variables and help of the report's
dimension rules (read by `analysis.report`), the `CLICKHOUSE` table those of the ClickHouse sessions' memory (read by
`analysis.clickhouse.model`); docs/settings.md is generated from them."""

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


class ClickHouseSettings(SettingsTable):
    """Where a ClickHouse session keeps the request model's temporary tables."""

    title = "ClickHouse sessions (`--engine clickhouse`, the dashboard on ClickHouse)"
    intro = ("Read by `analysis.clickhouse.model` each time it makes a temporary table (and named by a refusal for "
             "memory): the environment variable, "
             "else the default. The request model copies the spans it reads into a temporary table and computes "
             "its relations from that copy, each a temporary table too; together they hold about 2.7 times the "
             "copy (docs/scale-out.md#memory).")
    readers = ("analysis.clickhouse.model", "analysis.clickhouse.client")

    memory_temp_mib: Setting[int] = Setting(
        int, 512, "MiB up to which a temporary table is kept in memory (ClickHouse's Memory engine), as estimated "
        "before it is made (its rows counted, their width sampled); a larger one is a MergeTree table on the "
        "server's disk, slower to make but bounded in memory. The request model's tables all follow its copy of "
        "the spans (about 260 bytes a span: the default keeps about 2 M spans in memory); 0: always on disk",
        env="TAILSCOPE_CLICKHOUSE_MEMORY_TEMP_MIB")


#: The ClickHouse sessions' settings table.
CLICKHOUSE: Final = ClickHouseSettings()
