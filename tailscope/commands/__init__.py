"""One module per `tailscope` command; each exposes `register(app)`."""
