"""Checked keys kept per process, with revocation bounded in time on every worker and replica.

A namespace-scoped key used to cost a pooled connection and a query on every request. Now a key
is looked up once and its principal kept, under the sha256 of the presented key, for as long as
this process can vouch that no key was revoked since:

- each process runs ``watch()``, which reads the revocation state of the keys table
  (``service.revocation_state``: how many keys are revoked, and the latest revocation time) every
  ``auth.revocation_check_seconds`` (P); any change empties the cache;
- the cache answers only while the last check that succeeded *started* less than 2P ago; past
  that (the database is slow or down) every request looks its key up again, as before;
- a lookup that began before a change was seen is not kept (``_generation``), so a check racing
  a revocation cannot put the revoked key back.

So a key revoked anywhere (any worker, any replica, the ``keys`` CLI) is refused everywhere within
2P, and within the next request on the process that revoked it (``forget_all``). Keys that are
unknown or revoked are kept too (they never become valid: a new key has a new random secret), in
a bounded table, so a flood of one bad key does not reach the database.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from sqlalchemy.ext.asyncio import AsyncEngine

from app.auth import service
from app.auth.service import Principal
from app.core.capability import stop_if_cancelled

log = logging.getLogger("app.auth")

MAX_ENTRIES = 10_000


class KeyCache:
    def __init__(self, engine: AsyncEngine, check_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._engine = engine
        self.check_seconds = check_seconds
        self._clock = clock
        self._valid: dict[str, Principal] = {}
        self._invalid: dict[str, None] = {}
        self._state: tuple[object, ...] | None = None
        self._checked_at = float("-inf")  # start of the last check that succeeded
        self._generation = 0

    @property
    def fresh(self) -> bool:
        return self._clock() - self._checked_at < 2 * self.check_seconds

    async def principal(self, presented: str) -> Principal | None:
        """The principal of a presented key (None: unknown, malformed or revoked)."""
        if not service.well_formed(presented):
            return None
        digest = service.digest(presented)
        if self.fresh:
            found = self._valid.get(digest)
            if found is not None:
                return found
            if digest in self._invalid:
                return None
        generation = self._generation
        async with self._engine.connect() as conn:
            principal = await service.verify(conn, presented)
        if generation == self._generation:
            self._remember(digest, principal)
        return principal

    def _remember(self, digest: str, principal: Principal | None) -> None:
        table: dict[str, Principal] | dict[str, None] = self._valid if principal is not None else self._invalid
        if len(table) >= MAX_ENTRIES:
            table.pop(next(iter(table)))  # the oldest entry
        if principal is not None:
            self._valid[digest] = principal
        else:
            self._invalid[digest] = None

    def forget_all(self) -> None:
        """Empty the cache (this process revoked a key)."""
        self._generation += 1
        self._valid.clear()

    async def check(self) -> None:
        """Read the revocation state once; empty the cache when it changed."""
        started = self._clock()
        async with self._engine.connect() as conn:
            state = await service.revocation_state(conn)
        if state != self._state:
            if self._state is not None:
                log.info("an API key was revoked: cached keys forgotten")
            self._state = state
            self.forget_all()
        self._checked_at = started

    async def watch(self, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        """Check every ``check_seconds`` until cancelled; a failed check is retried on the next tick."""
        while True:
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 (the cache just goes stale: lookups hit the database)
                stop_if_cancelled()
                log.warning("checking for revoked API keys failed: %s", exc.__class__.__name__)
            await sleep(self.check_seconds)
