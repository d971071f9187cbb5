"""tailscope's command line (`tailscope ...`, or `python -m tailscope ...`): the top floor.

`tailscope.cli` is the typer app; each command lives in `tailscope.commands.<name>`. This
package composes the others (intake, analysis, dashboard, sample_traces); nothing imports it.
"""
