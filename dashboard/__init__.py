"""tailscope dashboard: the Streamlit incident workbench (`tailscope dashboard`); see docs/dashboard.md."""
