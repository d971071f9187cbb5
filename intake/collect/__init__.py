"""`tailscope collect`: an OTLP receiver (HTTP and gRPC) that stores spans durably in a segment store.

A 200 means the spans are on disk: requests are group-committed into one fsynced segment
before they are answered, so kill -9 loses nothing acknowledged, and re-sent spans are
dropped by a bounded window of recently stored keys. See docs/collect.md.
"""

from intake.collect.config import CollectConfig, read_token
from intake.collect.receiver import Receiver, Stats

__all__ = ["CollectConfig", "Receiver", "Stats", "read_token"]
