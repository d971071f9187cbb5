"""tailscope tracing: instrument inference serving code, and the store its traces land in."""
