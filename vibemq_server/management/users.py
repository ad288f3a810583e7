"""The broker's users as an operator sees them: list, detail, create or update (password,
tags), delete, set permissions -- never a password or a hash out, nor into the log.

Changes are written through the users file's own writer (``UserStore.change``: locked,
re-read, written atomically, the same as ``vibemq-server users``), then the broker's
authenticator reloads the file at once: open connections of a user whose permissions
changed are judged by the new ones from their next operation on (``Authenticator._regrant``).
A password is hashed (scrypt, ~50 ms) and the file written (fsync) on a worker thread: the
event loop never waits for either.

Only the users file's users are here; plain-text ``users`` of the config and token-only
users are configuration, not changed over the API.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from vibemq_server.auth import User, UsersFileError, UserStore
from vibemq_server.auth.passwords import hash_password
from vibemq_server.auth.users import FULL_PERMISSIONS
from vibemq_server.core.permissions import check_patterns
from vibemq_server.management.errors import Invalid, NotFound, Unavailable
from vibemq_server.server.broker import Broker

#: user names: printable, no ':' (basic auth's separator), as RabbitMQ's are in practice
_NAME = r"^[^\x00-\x1f\x7f:]{1,256}$"
_NAME_RE = re.compile(_NAME)
PermissionKind = Literal["configure", "write", "read"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Permissions(_Model):
    configure: str
    write: str
    read: str


class UserOut(_Model):
    name: str
    tags: list[str]
    permissions: Permissions


class UserIn(_Model):
    """Create (``password`` needed) or update (what is left out is kept)."""

    password: str | None = Field(None, min_length=1, max_length=1024, repr=False)
    tags: list[str] | None = Field(None, description="administrator, management, monitoring, ...")

    @field_validator("tags")
    @classmethod
    def _tags(cls, tags: list[str] | None) -> list[str] | None:
        if tags is not None and any(not t or not t.isprintable() or "," in t for t in tags):
            raise ValueError("a tag is a non-empty printable word without ','")
        return tags


class PermissionsIn(_Model):
    """RabbitMQ's three regular expressions; one left out is kept."""

    configure: str | None = Field(None, max_length=4096)
    write: str | None = Field(None, max_length=4096)
    read: str | None = Field(None, max_length=4096)


def _out(user: User) -> UserOut:
    return UserOut(
        name=user.name,
        tags=list(user.tags),
        permissions=Permissions(**{k: user.permissions[k] for k in FULL_PERMISSIONS}),
    )


def list_users(broker: Broker) -> list[UserOut]:
    """The users file's users in force, by name."""
    users = broker.auth.users
    return [_out(users[name]) for name in sorted(users)]


def get_user(broker: Broker, name: str) -> UserOut:
    user = broker.auth.users.get(name)
    if user is None:
        raise NotFound(f"no user {name!r}")
    return _out(user)


def _store(broker: Broker) -> UserStore:
    return UserStore(broker.config.users_path)


async def _change(broker: Broker, edit: Callable[[dict[str, User]], None]) -> dict[str, User]:
    """Edit the users file on a worker thread (lock, fsync), then reload it on the loop."""
    loop = asyncio.get_running_loop()
    try:
        users = await loop.run_in_executor(None, _store(broker).change, edit)
    except (UsersFileError, OSError) as exc:
        raise Unavailable(f"users file not written: {exc}") from None
    broker.auth.reload()
    return users


def _check_name(name: str) -> None:
    if not _NAME_RE.match(name):
        raise Invalid("1..256 printable characters, no ':'", "name")


async def put_user(broker: Broker, name: str, spec: UserIn) -> tuple[UserOut, bool]:
    """Create a user (a password is needed) or update one: (the user, whether created).
    A new user may touch everything (``FULL_PERMISSIONS``) until its permissions are set,
    as with ``vibemq-server users add``."""
    _check_name(name)
    password_hash = None
    if spec.password is not None:
        loop = asyncio.get_running_loop()
        password_hash = await loop.run_in_executor(None, hash_password, spec.password)
    created: list[bool] = []

    def edit(users: dict[str, User]) -> None:
        user = users.get(name)
        if user is None:
            if password_hash is None:
                raise _NeedsPassword  # nothing written
            users[name] = User(name, password_hash, list(spec.tags or []))
            created.append(True)
            return
        if password_hash is not None:
            user.password_hash = password_hash
        if spec.tags is not None:
            user.tags = list(spec.tags)

    try:
        users = await _change(broker, edit)
    except _NeedsPassword:
        raise Invalid("a new user needs a password", "password") from None
    return _out(users[name]), bool(created)


class _NeedsPassword(Exception):
    """No such user to update, and no password to create it with: the file is left alone."""


class _Missing(Exception):
    """The user named is not in the file: the file is left alone."""


async def delete_user(broker: Broker, name: str) -> None:
    """Delete a user: its open connections may do nothing more (``NO_ACCESS``)."""

    def edit(users: dict[str, User]) -> None:
        if users.pop(name, None) is None:
            raise _Missing  # nothing written

    try:
        await _change(broker, edit)
    except _Missing:
        raise NotFound(f"no user {name!r}") from None


def _validated(spec: PermissionsIn) -> dict[str, str]:
    given = {k: v for k, v in spec.model_dump().items() if v is not None}
    for kind, pattern in given.items():
        try:
            check_patterns({kind: pattern})
        except re.error as exc:
            raise Invalid(f"not a regular expression: {exc}", kind) from None
    return given


async def set_permissions(broker: Broker, name: str, spec: PermissionsIn) -> UserOut:
    """Set a user's configure/write/read patterns (validated first: Invalid names the
    field); open connections of the user are judged by them from their next operation."""
    given = _validated(spec)

    def edit(users: dict[str, User]) -> None:
        user = users.get(name)
        if user is None:
            raise _Missing  # nothing written
        user.permissions.update(given)

    try:
        users = await _change(broker, edit)
    except _Missing:
        raise NotFound(f"no user {name!r}") from None
    return _out(users[name])
