"""What a ClickHouse server takes: its release (`version()`) and settings (`system.settings`), read once per client.

tailscope supports the long-term-support releases from 24.8 on and the current one
(docs/scale-out.md, "Server releases"). One SQL text serves them all where it can; where an
optimisation needs a newer server the older one gets the plain spelling, with equal answers:

- `materialized_cte`: `WITH x AS MATERIALIZED (...)` and the `enable_materialized_cte`
  setting (26.3 on): a CTE read twice is computed once. Without it, the request model's
  CTEs are plain (ClickHouse may compute one twice; the rows are the same).

Refreshable materialized views that APPEND TO a table (not in 24.8), which `clickhouse init`
needs, are found by parsing its DDL there (analysis.clickhouse.requests.apply_schema): without
them `init` says so and creates nothing; requests are computed from the spans, as on a table
never initialised.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Final

from analysis.engine import dialect as D
from tracing.errors import TailscopeError

#: The oldest release tailscope supports (an LTS release).
OLDEST: Final = (24, 8)
#: The setting the materialized CTEs need (and the server has from the release that reads them).
MATERIALIZED_CTE_SETTING: Final = "enable_materialized_cte"
#: The request model's spelling for a server without materialized CTEs (otherwise analysis.engine.dialect.CLICKHOUSE).
PLAIN_DIALECT: Final = dataclasses.replace(D.CLICKHOUSE, materialized_ctes=False)


class UnsupportedServer(TailscopeError):
    """A ClickHouse release older than the oldest supported."""


@dataclass(frozen=True)
class Features:
    """The release of a server and what it takes that not every supported release does."""

    version: str
    materialized_cte: bool = True

    @property
    def dialect(self) -> D.Dialect:
        """The request model's ClickHouse spelling for this server."""
        return D.CLICKHOUSE if self.materialized_cte else PLAIN_DIALECT

    @property
    def settings(self) -> dict[str, int]:
        """The settings the model's queries run with (dialect.CLICKHOUSE_SETTINGS less what the server lacks)."""
        return {k: v for k, v in D.CLICKHOUSE_SETTINGS.items()
                if self.materialized_cte or k != MATERIALIZED_CTE_SETTING}


#: A current server: every optimisation (what SQL is generated for when no server is asked).
NEWEST: Final = Features("newest")


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a `version()` text such as '25.8.4.1'; UnsupportedServer when it does not read."""
    m = re.match(r"\s*(\d+)\.(\d+)", version)
    if m is None:
        raise UnsupportedServer(f"cannot read the ClickHouse release {version!r}")
    return int(m.group(1)), int(m.group(2))


def require_supported(version: str) -> tuple[int, int]:
    """The release of `version`; UnsupportedServer (one line) when it is older than OLDEST."""
    rel = release(version)
    if rel < OLDEST:
        raise UnsupportedServer(f"ClickHouse {rel[0]}.{rel[1]} is older than the oldest supported "
                                f"({OLDEST[0]}.{OLDEST[1]}): upgrade the server to an LTS release from "
                                f"{OLDEST[0]}.{OLDEST[1]} on (docs/scale-out.md, \"Server releases\")")
    return rel


def from_server(version: str, settings: dict[str, str]) -> Features:
    """The features of a server of release `version` whose system.settings holds `settings` (name -> value, of
    the names this module asks about)."""
    require_supported(version)
    return Features(version, materialized_cte=MATERIALIZED_CTE_SETTING in settings)


#: Features by DSN: asked once per engine or server address in a process (a wrapper of a client, which keeps its
#: `dsn`, shares its entry; each client opened asks again).
_CACHE: dict[Any, Features] = {}


def features(client: Any, *, fresh: bool = False) -> Features:
    """The features of the server behind `client` (an analysis.clickhouse.client.Client), asked once per DSN (again
    with `fresh`, as opening a client does: another server may answer at an address now)."""
    key = getattr(client, "dsn", None)
    if key is not None and key in _CACHE and not fresh:
        return _CACHE[key]
    version = str(client.query("SELECT version() AS v").to_pylist()[0]["v"])
    rows = client.query(f"SELECT name, value FROM system.settings WHERE name = '{MATERIALIZED_CTE_SETTING}'"
                        ).to_pylist()
    out = from_server(version, {str(r["name"]): str(r["value"]) for r in rows})
    if key is not None:
        if len(_CACHE) >= 256:  # bounded: a process that opens many addresses forgets the oldest
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = out
    return out
