"""tailscope dashboard: the router. Run with `tailscope dashboard [--store DIR]`.

Opens the store once (shared by every session), draws the shared sidebar filters, then
runs the chosen page. Pages live in dashboard/app_pages/ and stay thin; data comes from
dashboard/data.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import streamlit as st

HERE = Path(__file__).parent
if str(HERE.parent) not in sys.path:  # `streamlit run dashboard/app.py` from a checkout
    sys.path.insert(0, str(HERE.parent))

from dashboard import data, sidebar  # noqa: E402

# a local favicon: a `:material/...:` page icon is fetched from a font host, which an air-gapped cluster cannot reach
st.set_page_config(page_title="tailscope", page_icon=str(HERE / "favicon.png"), layout="wide")

PAGES = [
    st.Page(HERE / "app_pages" / "overview.py", title="Overview", icon=":material/monitoring:", default=True),
    st.Page(HERE / "app_pages" / "spike.py", title="Spike", icon=":material/local_fire_department:"),
    st.Page(HERE / "app_pages" / "alerts.py", title="Alerts", icon=":material/notifications:"),
    st.Page(HERE / "app_pages" / "traces.py", title="Traces", icon=":material/account_tree:"),
    st.Page(HERE / "app_pages" / "shape.py", title="Request shape", icon=":material/grid_on:"),
    st.Page(HERE / "app_pages" / "replicas.py", title="Replicas", icon=":material/dns:"),
    st.Page(HERE / "app_pages" / "whatif.py", title="What-if", icon=":material/tune:"),
    st.Page(HERE / "app_pages" / "capacity.py", title="Capacity", icon=":material/stacked_line_chart:"),
    st.Page(HERE / "app_pages" / "cost.py", title="Cost", icon=":material/payments:"),
    st.Page(HERE / "app_pages" / "sql.py", title="SQL", icon=":material/terminal:"),
]

page = st.navigation(PAGES)
db = data.open_store()
sidebar.render(db)
page.run()
