"""Settings of the dashboard: the `DASHBOARD` table owns their names, defaults, variables and help."""

from __future__ import annotations

from typing import Final

from tracing.settings import Setting, SettingsTable


class DashboardSettings(SettingsTable):
    """Settings of the Streamlit workbench."""

    title = "Dashboard (`tailscope dashboard`)"
    intro = ("Read by `dashboard.data` when the app starts: the environment variable, else the default. "
             "A malformed value is logged and replaced by the default.")
    readers = ("dashboard.data",)

    quick_load_bytes: Setting[int] = Setting(
        int, 64 * 1024 * 1024, "a (re)load reading more segment bytes than this shows request facts first, "
        "then the full analysis", env="TAILSCOPE_DASHBOARD_QUICK_BYTES")


#: How `tailscope dashboard --engine clickhouse` tells the app what to read (the DSN may hold a password,
#: so it never goes on the command line): engine, DSN, spans table.
ENV_ENGINE: Final = "TAILSCOPE_DASHBOARD_ENGINE"
ENV_DSN: Final = "TAILSCOPE_DASHBOARD_DSN"
ENV_TABLE: Final = "TAILSCOPE_DASHBOARD_TABLE"

#: The dashboard's settings table.
DASHBOARD: Final = DashboardSettings()
