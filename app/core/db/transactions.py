"""Request connections that end just before the answer leaves.

A route's connection dependency (``MetadataStatement`` and the others in
``app.core.dependencies``) opens a connection and registers it with the request's
``RequestConnections``. When the answer starts, ``TransactionMiddleware`` ends them first:
commit when the answer is a success, roll back otherwise, then let the answer go. So an
acknowledged write is a committed write, a refused one changed nothing, and a commit that fails
is answered by the app's own error handlers instead of the success it would have contradicted.

This takes the place of a generator dependency per connection, whose machinery (an exit stack
and a shielded cancel scope per request) cost about a quarter of a kv read's throughput at 16
requests in flight (``bench/bench_http_floor.py``, rows 4 and 5).
"""

from __future__ import annotations

import anyio
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncTransaction
from sqlalchemy.pool import PoolProxiedConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.db.inline import InlineConnection
from app.core.errors import app_error_response
from app.core.fences.sqlalchemy_ import close_pooled

SCOPE_KEY = "gateway.connections"


class RequestConnections:
    """The database connections one request opened, in opening order.

    Each is a SQLAlchemy connection (with its transaction, if it began one) or a connection
    borrowed from a pool for one driver-level statement (``app.core.db.statements``).
    """

    def __init__(self) -> None:
        self._open: list[tuple[AsyncConnection | PoolProxiedConnection, AsyncTransaction | None]] = []
        self._inline: list[InlineConnection] = []

    def add(self, conn: AsyncConnection | PoolProxiedConnection, transaction: AsyncTransaction | None = None) -> None:
        self._open.append((conn, transaction))

    def add_inline(self, conn: InlineConnection) -> None:
        """An inline statement: nothing to end, unless it borrowed a pooled connection."""
        self._inline.append(conn)

    def __bool__(self) -> bool:
        return bool(self._open or self._inline)

    async def end(self, commit: bool, *, clean: bool = True) -> None:
        """Commit (or roll back) and close every connection, newest first; after a failed
        commit the rest roll back, and the first error is raised once all are closed.

        ``clean=False``: the request stopped midway (an error escaped, or it was cancelled),
        so a borrowed driver connection may be inside a statement: it is discarded, not pooled.
        """
        error: BaseException | None = None
        while self._inline:
            pooled = self._inline.pop().pooled_if_borrowed()
            if pooled is not None:
                self._open.insert(0, (pooled, None))
        while self._open:
            conn, transaction = self._open.pop()
            if not isinstance(conn, AsyncConnection):
                try:
                    if not clean:
                        conn.invalidate()
                    await close_pooled(conn)
                except Exception as exc:  # noqa: BLE001 (kept, raised once every connection is closed)
                    error = error or exc
                continue
            try:
                if transaction is not None and transaction.is_active:
                    if commit and error is None:
                        await transaction.commit()
                    else:
                        await transaction.rollback()
            except Exception as exc:  # noqa: BLE001 (kept, raised once every connection is closed)
                error = error or exc
                # Its state is unknown (SQLite keeps the transaction open when COMMIT fails):
                # never lend it out again.
                await conn.invalidate()
            finally:
                try:
                    await conn.close()
                except Exception as exc:  # noqa: BLE001 (as above)
                    error = error or exc
        if error is not None:
            raise error


def request_connections(scope: Scope) -> RequestConnections:
    try:
        connections: RequestConnections = scope[SCOPE_KEY]
    except KeyError:
        raise RuntimeError("TransactionMiddleware is not installed") from None
    return connections


class TransactionMiddleware:
    """Ends the request's connections when its answer starts (or when it fails before that)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        connections = RequestConnections()
        scope[SCOPE_KEY] = connections
        replaced = False

        async def send_after_ending(message: Message) -> None:
            nonlocal replaced
            if replaced:
                return  # the app's own answer was swapped for an error: drop the rest of it
            if message["type"] == "http.response.start" and connections:
                try:
                    await connections.end(commit=message["status"] < 400)
                except Exception as exc:
                    response = await app_error_response(scope, exc)
                    if response is None:
                        raise
                    replaced = True
                    await response(scope, receive, send)
                    return
            await send(message)

        try:
            await self.app(scope, receive, send_after_ending)
        finally:
            if connections:
                # The answer never started (an error escaped, or the client went away): roll
                # back, shielded so a cancelled request still returns its connections.
                with anyio.CancelScope(shield=True):
                    await connections.end(commit=False, clean=False)
