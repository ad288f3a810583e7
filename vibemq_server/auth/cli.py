"""``vibemq-server users add|delete|passwd|list|tag|permit``: the users file, edited offline
or while the broker runs (it reloads the file when it changes).

Passwords come from a prompt or, with ``--password-stdin``, from the first line of standard
input: never from the command line, where any local user could read them (``ps``).
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import re
import sys
from pathlib import Path

from vibemq_server.auth.passwords import hash_password
from vibemq_server.auth.users import FULL_PERMISSIONS, User, UsersFileError, UserStore
from vibemq_server.config import load_config


class UsersCommandError(Exception):
    pass


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vibemq-server users",
        description="Manage the users file (scrypt password hashes, tags, permissions).",
    )
    p.add_argument(
        "--users-file", type=Path, help="default: the config's users_file, or <data_dir>/users.json"
    )
    p.add_argument("--config", type=Path, help="TOML config file (for data_dir / users_file)")
    sub = p.add_subparsers(dest="command", required=True)
    add = sub.add_parser("add", help="add a user (password from a prompt or --password-stdin)")
    add.add_argument("name")
    add.add_argument("--password-stdin", action="store_true")
    add.add_argument("--tag", action="append", default=[], dest="tags")
    delete = sub.add_parser("delete", help="delete a user")
    delete.add_argument("name")
    passwd = sub.add_parser("passwd", help="change a user's password")
    passwd.add_argument("name")
    passwd.add_argument("--password-stdin", action="store_true")
    listing = sub.add_parser("list", help="list users, tags and permissions (never hashes)")
    listing.add_argument("--json", action="store_true")
    tag = sub.add_parser("tag", help="set a user's tags (none: clear them)")
    tag.add_argument("name")
    tag.add_argument("tags", nargs="*")
    permit = sub.add_parser("permit", help="set a user's configure/write/read regexes")
    permit.add_argument("name")
    for kind in FULL_PERMISSIONS:
        permit.add_argument(f"--{kind}", metavar="REGEX", help=f"{kind} pattern (default: kept)")
    return p


def _read_password(from_stdin: bool) -> str:
    if from_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = getpass.getpass("Password: ")
        if getpass.getpass("Reenter password: ") != password:
            raise UsersCommandError("passwords do not match")
    if not password:
        raise UsersCommandError("empty password")
    return password


def _need(users: dict[str, User], name: str) -> User:
    user = users.get(name)
    if user is None:
        raise UsersCommandError(f"no such user: {name}")
    return user


def run(args: argparse.Namespace, store: UserStore) -> str:
    """Do the command; what to print."""
    command = args.command
    if command == "list":
        users = store.load()
        if args.json:
            out = {
                n: {"tags": u.tags, "permissions": u.permissions} for n, u in sorted(users.items())
            }
            return json.dumps(out, indent=2)
        return "\n".join(
            f"{n}\t[{', '.join(u.tags)}]\t"
            + " ".join(f"{k}={v!r}" for k, v in u.permissions.items())
            for n, u in sorted(users.items())
        )
    name = args.name
    if command in ("add", "passwd"):
        # Hashed before the lock is taken: the file is locked for a moment only.
        password_hash = hash_password(_read_password(args.password_stdin))

        def edit(users: dict[str, User]) -> None:
            if command == "add":
                if name in users:
                    raise UsersCommandError(f"user already exists: {name}")
                users[name] = User(name, password_hash, list(args.tags))
            else:
                _need(users, name).password_hash = password_hash

    elif command == "delete":

        def edit(users: dict[str, User]) -> None:
            _need(users, name)
            del users[name]

    elif command == "tag":

        def edit(users: dict[str, User]) -> None:
            _need(users, name).tags = list(args.tags)

    else:  # permit
        given = {k: getattr(args, k) for k in FULL_PERMISSIONS if getattr(args, k) is not None}
        for kind, pattern in given.items():
            try:
                re.compile(pattern)
            except re.error as exc:
                raise UsersCommandError(f"bad {kind} pattern {pattern!r}: {exc}") from None

        def edit(users: dict[str, User]) -> None:
            _need(users, name).permissions.update(given)

    store.change(edit)
    return f"{command}: {name} ({store.path})"


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    path: Path | None = args.users_file
    if path is None:
        config_path = args.config or (
            Path(os.environ["VIBEMQ_CONFIG"]) if os.environ.get("VIBEMQ_CONFIG") else None
        )
        try:
            path = load_config(config_path, dict(os.environ)).users_path
        except (OSError, ValueError) as exc:
            print(f"vibemq-server users: invalid configuration: {exc}", file=sys.stderr)
            return 2
    try:
        out = run(args, UserStore(path))
    except (UsersCommandError, UsersFileError, OSError) as exc:
        print(f"vibemq-server users: {exc}", file=sys.stderr)
        return 1
    if out:
        print(out)
    return 0
