"""Request bodies are bounded (``http.max_body_bytes``): 413 when the declared length is
over the bound (the body is then never handed to the app), or as soon as a chunked body
passes it. The connection stays open: what the client still sends of that body is read and
dropped (nothing is kept), so it can read its 413 rather than a reset; a body that never
ends is cut by the request deadline (protocol.py)."""

from __future__ import annotations

import json

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` while the app reads a body: FastAPI lets an HTTPException
    through its body parsing, and its exception handler answers it (413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body over {limit} bytes")


async def _too_large(send: Send, limit: int) -> None:
    body = json.dumps({"detail": f"request body over {limit} bytes"}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit
        for key, value in scope.get("headers", ()):
            if key == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = limit + 1
                if declared > limit:
                    await _too_large(send, limit)
                    return
        seen = 0
        started = False

        async def bounded_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, bounded_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await _too_large(send, limit)
