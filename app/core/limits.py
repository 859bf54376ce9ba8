"""Request body limits enforced before a handler reads anything.

JSON routes are bounded by ``limits.max_body_bytes``: a declared ``Content-Length`` over it is
refused at once, and a chunked body is counted as it arrives. File uploads stream and count
their own bytes against ``limits.max_file_bytes`` instead, so they are passed through.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.errors import PayloadTooLarge, render


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int, streamed_marker: str = "/files/") -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.streamed_marker = streamed_marker

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.streamed_marker in scope.get("path", ""):
            await self.app(scope, receive, send)
            return
        limit = self.max_body_bytes
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > limit:
                    await self._refuse(scope, receive, send, limit)
                    return
        # Read the whole (bounded) body now; JSON handlers would hold it in memory anyway.
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > limit:
                await self._refuse(scope, receive, send, limit)
                return
            chunks.append(body)
            more = message.get("more_body", False)
        payload = b"".join(chunks)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": payload, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        response = render(PayloadTooLarge(f"request body exceeds the limit of {limit} bytes"))
        response.headers["Connection"] = "close"
        await response(scope, receive, send)
