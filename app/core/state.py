"""The application's state, typed: one ``GatewayState`` on ``app.state.gateway``.

Everything a request or a lifecycle reaches through the app is a field here, never an untyped
``app.state`` attribute: ``gateway_state(request.app)`` (or ``service_of`` for a
capability's own service). The app factory creates it; the lifespan fills in what needs the
databases open (``databases``, ``key_cache``, the services).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.requests import Request

if TYPE_CHECKING:
    from app.auth.cache import KeyCache
    from app.auth.ratelimit import RateLimiter
    from app.core.capability import Capability
    from app.core.config import Settings
    from app.core.db.databases import Databases
    from app.core.db.diskspace import DiskSpace
    from app.core.ops.health import StorageStatus

StorageCheck = Callable[[], Awaitable["StorageStatus"]]


class NotStarted(RuntimeError):
    """A part of the state that only exists while the app's lifespan runs was used outside it."""


@dataclass(eq=False)
class GatewayState:
    settings: Settings
    capabilities: tuple[Capability[Any], ...]
    rate_limiter: RateLimiter  # requests per key (auth.rate_limit_*)
    namespace_limiter: RateLimiter | None = None  # per namespace, any key (auth.namespace_rate_limit_*)
    services: dict[str, object] = field(default_factory=dict)
    """Each capability's service, by capability name (built by its lifecycle)."""
    storage_checks: dict[str, StorageCheck] = field(default_factory=dict)
    """Storage besides the databases that ``/readyz`` reports (the files bucket), by capability."""
    disk_space: DiskSpace | None = None
    """While the lifespan runs: what ``app.core.db.diskspace`` knows about a full disk."""
    _databases: Databases | None = None
    _key_cache: KeyCache | None = None

    @property
    def databases(self) -> Databases:
        if self._databases is None:
            raise NotStarted("the databases are opened by the app's lifespan")
        return self._databases

    @databases.setter
    def databases(self, value: Databases) -> None:
        self._databases = value

    @property
    def open_databases(self) -> Databases | None:
        """The databases while the lifespan runs, else ``None``."""
        return self._databases

    @property
    def key_cache(self) -> KeyCache:
        if self._key_cache is None:
            raise NotStarted("the key cache is created by the app's lifespan")
        return self._key_cache

    @key_cache.setter
    def key_cache(self, value: KeyCache) -> None:
        self._key_cache = value

    @property
    def capability_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.capabilities)


def service_of(request: Request, capability: str) -> Any:
    """The service the lifecycle of ``capability`` built (for its request dependencies)."""
    return request.app.state.gateway.services[capability]


def disk_space_of(request: Request) -> DiskSpace | None:
    """What ``app.core.db.diskspace`` knows of a full disk; ``None`` outside a running gateway
    (and for an app not made by ``create_app``)."""
    state: GatewayState | None = getattr(request.app.state, "gateway", None)
    return state.disk_space if state is not None else None


def gateway_state(app: Starlette) -> GatewayState:
    state: GatewayState = app.state.gateway
    return state
