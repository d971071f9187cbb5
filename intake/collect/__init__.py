"""`tailscope collect`: an OTLP receiver (HTTP and gRPC) that stores spans durably in a segment store.

A 200 means the spans are on disk: requests are group-committed into one fsynced segment
before they are answered, so kill -9 loses nothing acknowledged, and re-sent spans are
dropped by a bounded window of recently stored keys. See docs/collect.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from intake.collect.config import CollectConfig, read_token

if TYPE_CHECKING:
    from intake.collect.receiver import Receiver, Stats

__all__ = ["CollectConfig", "Receiver", "Stats", "read_token"]


def __getattr__(name: str) -> Any:
    """The receiver loads on first use (grpc, pyarrow), so the CLI can read the settings without it."""
    if name in ("Receiver", "Stats"):
        from intake.collect import receiver

        return getattr(receiver, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
