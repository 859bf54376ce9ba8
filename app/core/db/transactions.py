"""Request connections that end just before the answer leaves.

A route's connection dependency (``MetadataConnection`` and the others in
``app.core.dependencies``) opens a connection and registers it with the request's
``RequestConnections``. When the answer starts, ``TransactionMiddleware`` ends them first:
commit when the answer is a success, roll back otherwise, then let the answer go.

The rule: an acknowledged write is a committed write, a refused one changed nothing, and a
commit that fails is answered by the app's own error handlers instead of the success it would
have contradicted. (One middleware rather than a generator dependency per connection: cheaper per
request, ``docs/benchmarks.md``.)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
from sqlalchemy.ext.asyncio import AsyncConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.errors import app_error_response

SCOPE_KEY = "gateway.connections"

Release = Callable[[bool], Awaitable[None]]
"""Gives back a connection borrowed outside SQLAlchemy's ``Connection`` (``app.core.fast``);
its argument says whether the request ended cleanly (else the connection may be mid-statement)."""


class RequestConnections:
    """The database connections one request opened, in opening order: SQLAlchemy connections
    (their transaction begun explicitly, or by SQLAlchemy on their first statement) and
    connections borrowed for one statement, each with what gives it back."""

    def __init__(self) -> None:
        self._open: list[AsyncConnection | Release] = []

    def add(self, conn: AsyncConnection) -> None:
        self._open.append(conn)

    def add_release(self, release: Release) -> None:
        self._open.append(release)

    def __bool__(self) -> bool:
        return bool(self._open)

    async def end(self, commit: bool, *, clean: bool = True) -> None:
        """Commit (or roll back) and close every connection, newest first; after a failed
        commit the rest roll back, and the first error is raised once all are closed.

        ``clean=False``: the request stopped midway (an error escaped, or it was cancelled).
        """
        error: BaseException | None = None
        while self._open:
            conn = self._open.pop()
            if not isinstance(conn, AsyncConnection):
                try:
                    await conn(clean)
                except Exception as exc:  # noqa: BLE001 (kept, raised once every connection is closed)
                    error = error or exc
                continue
            try:
                if conn.in_transaction():
                    if commit and error is None:
                        await conn.commit()
                    else:
                        await conn.rollback()
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
