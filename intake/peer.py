"""The sending peer's address as a resource attribute, so replicas stay apart when their resource says nothing.

TGI and Triton export a resource holding only `service.name`; vLLM and SGLang one whose only
instance key is a random per-process UUID. `tailscope collect` adds `tailscope.peer` (the
client's IP address, without the ephemeral port) to every resource of a request it receives
and recomputes the replica with `tracing.rows.replica_of`, where the peer ranks below the
names a person gives (docs/convention.md#replica).
"""

from __future__ import annotations

import pyarrow as pa

from tracing import schema as S
from tracing.rows import replica_of


def peer_host(address: object) -> str | None:
    """The host part of a socket peer: ('10.0.0.7', 51234) → '10.0.0.7'; gRPC 'ipv4:10.0.0.7:5' too."""
    if isinstance(address, (tuple, list)) and address:
        return str(address[0]) or None
    if isinstance(address, str) and address:
        kind, _, rest = address.partition(":")
        if kind in ("ipv4", "ipv6") and rest:
            host, _, _port = rest.rpartition(":")
            return host.strip("[]") or None
        if kind == "unix":
            return None
        return address
    return None


def with_peer(table: pa.Table, peer: str | None) -> pa.Table:
    """`table` with `tailscope.peer` = `peer` on every resource lacking it, and Replica recomputed."""
    if peer is None or table.num_rows == 0:
        return table
    resources = table.column("ResourceAttributes").to_pylist()
    cache: dict[tuple[tuple[str, str], ...], tuple[list[tuple[str, str]], str | None]] = {}
    new_res: list[list[tuple[str, str]]] = []
    replicas: list[str | None] = []
    for items in resources:
        key = tuple(items or ())
        hit = cache.get(key)
        if hit is None:
            attrs = dict(key)
            attrs.setdefault(S.ATTR_PEER, peer)
            hit = (list(attrs.items()), replica_of(attrs))
            cache[key] = hit
        new_res.append(hit[0])
        replicas.append(hit[1])
    i = table.schema.get_field_index("ResourceAttributes")
    table = table.set_column(i, "ResourceAttributes", pa.array(new_res, S.ATTRS))
    j = table.schema.get_field_index("Replica")
    return table.set_column(j, "Replica", pa.array(replicas, pa.string()))


__all__ = ["peer_host", "with_peer"]
