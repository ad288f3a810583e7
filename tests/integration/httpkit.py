"""The HTTP listener in tests: a users file with tagged users, httpx clients, and raw
sockets for what a well-behaved client never sends (half requests, traversal paths)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from vibemq_server.auth import User, UserStore
from vibemq_server.auth.passwords import hash_password
from vibemq_server.server import Broker

HOST = "127.0.0.1"
#: scrypt's cost kept low in tests (the stored parameters are used to verify)
TEST_LOG_N = 10
#: name -> (password, tags)
TAGGED_USERS = {
    "admin": ("admin-pw", ["administrator"]),
    "manager": ("manager-pw", ["management"]),
    "watcher": ("watcher-pw", ["monitoring"]),
    "nobody": ("nobody-pw", []),
}


def write_users(path: Path, users: dict[str, tuple[str, list[str]]] = TAGGED_USERS) -> Path:
    UserStore(path).save(
        {
            name: User(name, hash_password(password, TEST_LOG_N), list(tags))
            for name, (password, tags) in users.items()
        }
    )
    return path


def base_url(broker: Broker, key: str = "http") -> str:
    port = broker.ready()[key]
    assert isinstance(port, int), f"no {key} listener"
    scheme = "https" if key == "http_tls" else "http"
    return f"{scheme}://{HOST}:{port}"


def client(broker: Broker, user: str | None = None, **kw: object) -> httpx.AsyncClient:
    """An httpx client of ``broker``'s HTTP listener, as ``user`` (TAGGED_USERS) or none."""
    auth = None if user is None else (user, TAGGED_USERS[user][0])
    return httpx.AsyncClient(base_url=base_url(broker), auth=auth, timeout=10.0, **kw)  # type: ignore[arg-type]


async def raw_request(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send ``data`` on a fresh connection and read until the server closes it."""
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(timeout):
            return await reader.read(-1)
    finally:
        writer.close()
