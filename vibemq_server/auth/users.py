"""The users file: names, password hashes, tags and permissions, kept as JSON.

Written atomically (a temporary file in the same directory, mode 0600, fsync, ``os.replace``)
under an exclusive ``flock`` on a lock file next to it, re-read under that lock before every
change: two ``vibemq-server users add`` at once both land, and a broker reading the file
never sees half of one. A file that cannot be read as a users file is refused with its path.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vibemq_server.auth.passwords import check_hash

FORMAT_VERSION = 1
#: What a user may touch (RabbitMQ's three regular expressions; enforced by the permission
#: model, issue 13 item 3); a new user may touch everything, as a plain-config user can.
FULL_PERMISSIONS = {"configure": ".*", "write": ".*", "read": ".*"}


class UsersFileError(ValueError):
    """The users file exists but is not one (its path is in the message)."""


@dataclass(slots=True)
class User:
    name: str
    password_hash: str
    tags: list[str] = field(default_factory=list)
    permissions: dict[str, str] = field(default_factory=lambda: dict(FULL_PERMISSIONS))

    def to_json(self) -> dict[str, Any]:
        return {
            "password_hash": self.password_hash,
            "tags": list(self.tags),
            "permissions": dict(self.permissions),
        }


def _user(path: Path, name: Any, entry: Any) -> User:
    if not isinstance(name, str) or not name or not isinstance(entry, dict):
        raise UsersFileError(f"{path}: bad entry for user {name!r}")
    password_hash = entry.get("password_hash")
    tags = entry.get("tags", [])
    permissions = entry.get("permissions", FULL_PERMISSIONS)
    if not isinstance(password_hash, str):
        raise UsersFileError(f"{path}: user {name!r} has no password_hash")
    try:
        check_hash(password_hash)
    except (ValueError, KeyError) as exc:
        raise UsersFileError(f"{path}: user {name!r}: unreadable password hash ({exc})") from None
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise UsersFileError(f"{path}: user {name!r}: tags must be a list of strings")
    if not isinstance(permissions, dict) or not all(
        isinstance(permissions.get(k), str) for k in FULL_PERMISSIONS
    ):
        raise UsersFileError(
            f"{path}: user {name!r}: permissions need configure, write and read patterns"
        )
    return User(name, password_hash, tags, {k: permissions[k] for k in FULL_PERMISSIONS})


class UserStore:
    """One users file. ``load()`` for readers; ``change(fn)`` for writers (locked)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock_path = path.with_name(path.name + ".lock")

    def stamp(self) -> tuple[int, int, int] | None:
        """What changes when the file is replaced (cheap: one stat); None when absent."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def load(self) -> dict[str, User]:
        """The users; none when the file does not exist; UsersFileError when it is not one."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise UsersFileError(f"{self.path}: cannot read users file: {exc}") from None
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise UsersFileError(f"{self.path}: not a users file (invalid JSON: {exc})") from None
        if not isinstance(data, dict) or not isinstance(data.get("users"), dict):
            raise UsersFileError(f'{self.path}: not a users file (no "users" object)')
        if data.get("version", FORMAT_VERSION) != FORMAT_VERSION:
            raise UsersFileError(f"{self.path}: unknown users file version {data['version']!r}")
        return {name: _user(self.path, name, entry) for name, entry in data["users"].items()}

    def save(self, users: dict[str, User]) -> None:
        """Atomically: a 0600 temporary file beside it, fsync'd, renamed over it."""
        doc = {
            "version": FORMAT_VERSION,
            "users": {name: users[name].to_json() for name in sorted(users)},
        }
        data = (json.dumps(doc, indent=2) + "\n").encode()
        directory = self.path.parent
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".{self.path.name}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fchmod(fd, 0o600)  # whatever the umask, and if the name existed
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def change(self, edit: Callable[[dict[str, User]], None]) -> dict[str, User]:
        """Lock, re-read, edit, write back: concurrent writers never lose each other's."""
        with self.locked():
            users = self.load()
            edit(users)
            self.save(users)
            return users
