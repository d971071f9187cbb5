"""Settings of the dashboard: the `DASHBOARD` table owns their names, defaults, variables and help."""

from __future__ import annotations

from typing import Final

from tracing.settings import Setting, SettingsTable

#: How `tailscope dashboard --engine clickhouse` tells the app what to read (the DSN may hold a password,
#: so it never goes on the command line): engine, DSN, spans table.
ENV_ENGINE: Final = "TAILSCOPE_DASHBOARD_ENGINE"
ENV_DSN: Final = "TAILSCOPE_DASHBOARD_DSN"
ENV_TABLE: Final = "TAILSCOPE_DASHBOARD_TABLE"


class DashboardSettings(SettingsTable):
    """Settings of the Streamlit workbench."""

    title = "Dashboard (`tailscope dashboard`)"
    intro = ("Read by `dashboard.data` when the app starts: the environment variable, else the default. "
             "A malformed value is logged and replaced by the default.")
    readers = ("dashboard.data",)

    quick_load_bytes: Setting[int] = Setting(
        int, 64 * 1024 * 1024, "a (re)load reading more segment bytes than this shows request facts first, "
        "then the full analysis", env="TAILSCOPE_DASHBOARD_QUICK_BYTES")
    engine: Setting[str] = Setting(
        str, "duckdb", "what the pages read: duckdb (a store) or clickhouse (an otel_traces table); "
        "`tailscope dashboard --engine` sets it", env=ENV_ENGINE)
    dsn: Setting[str] = Setting(
        str, "", "the ClickHouse DSN with the clickhouse engine; `tailscope dashboard --dsn` sets it (never on "
        "the app's command line: it may hold a password)", env=ENV_DSN)
    table: Setting[str] = Setting(
        str, "otel_traces", "the ClickHouse spans table; `tailscope dashboard --table` sets it", env=ENV_TABLE)


#: The dashboard's settings table.
DASHBOARD: Final = DashboardSettings()
