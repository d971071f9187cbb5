"""`python -m tailscope ...`: the same command line as the `tailscope` script."""

from tailscope.cli import main

main()
