"""The auth package without sockets: password hashes, the users file, the authenticator's
verdicts in every mode, the failed-login delays and the secure-by-default check."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest

from vibemq_server.auth import (
    Authenticator,
    InsecureDefault,
    User,
    UsersFileError,
    UserStore,
    check_exposure,
    is_loopback_peer,
)
from vibemq_server.auth.authenticator import Outcome, parse_tokens
from vibemq_server.auth.exposure import is_loopback_host
from vibemq_server.auth.guard import LoginGuard
from vibemq_server.auth.passwords import hash_password, verify_password
from vibemq_server.config import Config
from vibemq_server.healthcheck import token_from_env

LOOPBACK = "127.0.0.1"
REMOTE = "192.0.2.7"


def test_hash_and_verify() -> None:
    encoded = hash_password("s3cret", log_n=10)
    assert encoded.startswith("$scrypt$ln=10,r=8,p=1$") and "s3cret" not in encoded
    assert verify_password("s3cret", encoded)
    assert not verify_password("s3cret!", encoded)
    assert hash_password("s3cret", log_n=10) != encoded  # a salt per hash
    assert not verify_password("s3cret", "$scrypt$ln=99,r=8,p=1$AA$AA")
    assert not verify_password("s3cret", "plain")


def test_store_round_trip_mode_and_corruption(tmp_path: Path) -> None:
    store = UserStore(tmp_path / "sub" / "users.json")
    assert store.load() == {}
    store.change(lambda users: users.update(alice=User("alice", hash_password("pw", 10))))
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert list(store.load()) == ["alice"]
    for bad in ("{", "[]", '{"users": {"a": {}}}', '{"users": {"a": {"password_hash": "x"}}}'):
        store.path.write_text(bad)
        with pytest.raises(UsersFileError, match=str(store.path)):
            store.load()


def make(tmp_path: Path, **settings: Any) -> Authenticator:
    return Authenticator(Config(data_dir=tmp_path, auth_failure_delay_s=0, **settings))


def test_anonymous_mode(tmp_path: Path) -> None:
    auth = make(tmp_path)
    assert auth.authenticate(None, None, LOOPBACK, "mqtt").outcome is Outcome.ANONYMOUS
    assert auth.authenticate(None, None, "::ffff:127.0.0.1", "mqtt").ok
    remote = auth.authenticate(None, None, REMOTE, "mqtt")
    assert remote.outcome is Outcome.CREDENTIALS_REQUIRED and not remote.ok
    # No credentials exist, so any given are wrong.
    assert auth.authenticate("a", "b", LOOPBACK, "amqp").outcome is Outcome.BAD_CREDENTIALS
    assert auth.authenticate_token("t", LOOPBACK, "vibemq").outcome is Outcome.BAD_CREDENTIALS


@pytest.mark.parametrize(
    ("allow", "loopback", "remote"),
    [(None, False, False), (True, True, True), (False, False, False)],
)
def test_anonymous_with_credentials(
    tmp_path: Path, allow: bool | None, loopback: bool, remote: bool
) -> None:
    auth = make(tmp_path, users={"alice": "pw"}, allow_anonymous=allow)
    assert auth.authenticate(None, None, LOOPBACK, "mqtt").ok is loopback
    assert auth.authenticate(None, None, REMOTE, "mqtt").ok is remote
    assert auth.authenticate("alice", "pw", REMOTE, "mqtt").user == "alice"
    assert not auth.authenticate("alice", "no", LOOPBACK, "mqtt").ok


def test_tokens_are_bound_to_users(tmp_path: Path) -> None:
    assert parse_tokens(["a:b:alice", "bare", ":x", "y:"], "admin") == {
        "a:b": "alice",
        "bare": "admin",
        ":x": "admin",
        "y:": "admin",
    }
    auth = make(tmp_path, auth_tokens=["t1:alice", "t2"])
    assert auth.authenticate_token("t1", REMOTE, "vibemq").user == "alice"
    assert auth.authenticate_token("t2", REMOTE, "vibemq").user == "admin"
    # As a password, a token logs in as its own user, whatever name is given.
    assert auth.authenticate("anyone", "t1", REMOTE, "amqp").user == "alice"


def test_users_file_reload(tmp_path: Path) -> None:
    auth = make(tmp_path)
    assert not auth.check_reload()
    UserStore(tmp_path / "users.json").change(
        lambda users: users.update(bob=User("bob", hash_password("pw", 10)))
    )
    assert auth.check_reload() and auth.credentials_configured
    assert auth.authenticate("bob", "pw", REMOTE, "mqtt").user == "bob"
    assert auth.authenticate("bob", "pw", REMOTE, "mqtt").user == "bob"  # cached
    assert not auth.authenticate(None, None, LOOPBACK, "mqtt").ok  # no anonymous now
    (tmp_path / "users.json").write_text("garbage")
    assert not auth.check_reload()  # a corrupt file keeps the users in force
    assert auth.authenticate("bob", "pw", REMOTE, "mqtt").user == "bob"


def test_guard_doubles_caps_and_forgets() -> None:
    now = [0.0]
    guard = LoginGuard(0.1, 1.0, forget_after=60, now=lambda: now[0])
    assert [guard.failed("a") for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert guard.failed("b") == 0.1  # per address
    now[0] = 61.0
    assert guard.failed("a") == 0.1


def test_guard_connection_rate() -> None:
    now = [0.0]
    guard = LoginGuard(0, 0, connection_rate=1.0, connection_burst=2, now=lambda: now[0])
    assert [guard.allow_connection("a") for _ in range(3)] == [True, True, False]
    assert guard.allow_connection("b")
    now[0] = 1.0
    assert guard.allow_connection("a")


def test_exposure(tmp_path: Path) -> None:
    assert is_loopback_peer("127.0.0.2") and is_loopback_peer("::1")
    assert not is_loopback_peer(REMOTE) and not is_loopback_peer("")
    assert is_loopback_host("localhost") and not is_loopback_host("0.0.0.0")
    check_exposure(Config(data_dir=tmp_path), False)
    with pytest.raises(InsecureDefault, match="allow_anonymous"):
        check_exposure(Config(data_dir=tmp_path, host="0.0.0.0"), False)
    with pytest.raises(InsecureDefault, match="amqp on ::"):
        check_exposure(Config(data_dir=tmp_path, amqp={"host": "::"}), False)
    check_exposure(Config(data_dir=tmp_path, amqp={"host": "::", "enabled": False}), False)
    check_exposure(Config(data_dir=tmp_path, host="0.0.0.0"), True)
    check_exposure(Config(data_dir=tmp_path, host="0.0.0.0", allow_anonymous=True), False)


def test_the_healthcheck_sends_the_token_of_a_bound_entry() -> None:
    assert token_from_env({"VIBEMQ_AUTH_TOKENS": "tok:alice,other"}) == "tok"
    assert token_from_env({"VIBEMQ_AUTH_TOKENS": '["a:b:svc"]'}) == "a:b"
    assert token_from_env({"VIBEMQ_AUTH_TOKENS": "bare"}) == "bare"
