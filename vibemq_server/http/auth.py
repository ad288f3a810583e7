"""Who may use the HTTP listener, checked before a request's body is read (ASGI middleware).

Credentials are the broker's own (auth package): HTTP basic auth with a user's name and
password (a token in the password field works, as for the protocols), or ``Authorization:
Bearer <token>`` with a configured token. The password check (scrypt, ~50 ms) runs on a worker
thread: the loop keeps serving meanwhile. A refused login is counted and its 401 held back as
for the protocols (auth/guard.py).

What a user may do is set by tags, as RabbitMQ's management plugin does (protocol permissions
do not apply here): ``administrator`` or ``management``: everything; ``monitoring``: read
(GET and HEAD) only; no such tag: nothing (403). Anonymous clients (no credentials, let in by
the protocols' rule: loopback peers while no user or token exists, or ``allow_anonymous``),
plain-config users and users named only by a token (none of which has tags) may do
everything, as they may on the protocols. Anonymous access is only ever granted to loopback
peers here, whatever ``allow_anonymous`` says: the API is never open to the network.

Open without credentials: ``/health/*`` (``http.open_health``), ``/metrics``
(``http.open_metrics``: by default to loopback peers only), the API's documentation
(``/api/docs``, ``/api/openapi.json``, ``/api/static/``) and the dashboard's page and files
(``/``, ``/dashboard/``): they hold no broker data.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
from starlette.types import ASGIApp, Receive, Scope, Send

from vibemq_server.auth import ANONYMOUS, Authenticator, Verdict, is_loopback_peer
from vibemq_server.config import HttpConfig

log = structlog.get_logger("vibemq.http")

#: tags that allow every call, and tags that allow reading
WRITE_TAGS = frozenset({"administrator", "management"})
READ_TAGS = WRITE_TAGS | {"monitoring"}
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: paths open to everyone: the API's description and the dashboard's page and files (no
#: broker data in them: the dashboard's script calls the API, with credentials)
DOC_PATHS = ("/api/docs", "/api/openapi.json", "/api/static/", "/dashboard/")
PAGE_PATHS = frozenset({"/"})
CHALLENGES = [
    (b"www-authenticate", b'Basic realm="VibeMQ", charset="UTF-8"'),
    (b"www-authenticate", b'Bearer realm="VibeMQ"'),
]


@dataclass(frozen=True, slots=True)
class Principal:
    """Who made a request, and what the tags let them do."""

    user: str
    read: bool
    write: bool

    def may(self, method: str) -> bool:
        return self.read if method in READ_METHODS else self.write


def principal_for(auth: Authenticator, user: str) -> Principal:
    tags = auth.tags(user)
    if tags is None:  # anonymous, plain-config or token-only users: everything, as elsewhere
        return Principal(user, True, True)
    return Principal(user, bool(READ_TAGS & set(tags)), bool(WRITE_TAGS & set(tags)))


def principal_of(scope: Scope) -> Principal | None:
    """The authenticated user of a request (None on an open path)."""
    found = scope.get("state", {}).get("principal")
    return found if isinstance(found, Principal) else None


def _peer(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else ""


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value)
    return None


async def _reply(send: Send, status: int, detail: str, extra: list[tuple[bytes, bytes]]) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *extra,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class AuthMiddleware:
    """Authenticates every request but those to open paths; 401 or 403 before the app runs."""

    def __init__(self, app: ASGIApp, auth: Authenticator, config: HttpConfig) -> None:
        self.app = app
        self.auth = auth
        self.config = config

    def _open(self, path: str, peer: str) -> bool:
        if path.startswith("/health/") or path == "/health":
            return self.config.open_health
        if path == "/metrics":
            open_metrics = self.config.open_metrics
            return is_loopback_peer(peer) if open_metrics is None else open_metrics
        return path in PAGE_PATHS or path.startswith(DOC_PATHS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        peer = _peer(scope)
        if self._open(scope["path"], peer):
            await self.app(scope, receive, send)
            return
        principal, why = await self._authenticate(scope, peer)
        if principal is None:
            await _reply(send, 401, why, CHALLENGES)
            return
        if not principal.may(scope["method"]):
            what = "read" if scope["method"] in READ_METHODS else "change"
            await _reply(send, 403, f"user {principal.user!r} may not {what} this", [])
            return
        scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)

    async def _authenticate(self, scope: Scope, peer: str) -> tuple[Principal | None, str]:
        auth = self.auth
        header = _header(scope, b"authorization")
        if header is None:
            # No credentials is not a failed login (a browser asks first, then retries).
            if is_loopback_peer(peer) and auth.anonymous_allowed(peer):
                return principal_for(auth, ANONYMOUS), ""
            return None, "credentials required (basic auth or a bearer token)"
        scheme, _, value = header.decode("latin-1").partition(" ")
        scheme = scheme.lower()
        value = value.strip()
        if scheme == "bearer" and value:
            verdict = auth.authenticate_token(value, peer, "http")
            username: str | None = None
        elif scheme == "basic" and (pair := _basic(value)) is not None:
            username, password = pair
            verdict = await _login(auth, username, password, peer)
        else:
            return None, "unsupported Authorization header (use Basic or Bearer)"
        if verdict.user is None:
            if verdict.delay:
                await asyncio.sleep(verdict.delay)  # held back, as for the protocols
            return None, "bad credentials"
        return principal_for(auth, verdict.user), ""


async def _login(auth: Authenticator, username: str, password: str, peer: str) -> Verdict:
    """The protocols' login (``Authenticator.login``): a cached or token login decided at
    once, a password hash verified in a worker thread (scrypt, ~50 ms, off the loop)."""
    loop = asyncio.get_running_loop()
    verdict: asyncio.Future[Verdict] = loop.create_future()

    def offload(work: Callable[[], bool], then: Callable[[bool], None]) -> None:
        def done(future: asyncio.Future[bool]) -> None:
            error = future.exception()
            if error is not None:
                verdict.set_exception(error)
            else:
                then(future.result())

        loop.run_in_executor(None, work).add_done_callback(done)

    auth.login(username, password, peer, "http", verdict.set_result, offload)
    return await verdict


def _basic(value: str) -> tuple[str, str] | None:
    try:
        decoded = base64.b64decode(value, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    name, sep, password = decoded.partition(":")
    return (name, password) if sep else None


def log_change(scope: Scope, action: str, target: str, **details: Any) -> None:
    """Every change made over the API, at info: who, what, on what (never a credential)."""
    principal = principal_of(scope)
    log.info(
        "management change",
        user=principal.user if principal else None,
        peer=_peer(scope),
        action=action,
        target=target,
        **details,
    )
