"""The one authenticator of every protocol.

Credentials, in the order they are tried for a name and a password:

1. the users file (scrypt hashes; reloaded when it changes, without a restart);
2. plain-text ``users`` of the config (still accepted, with a warning at start);
3. ``auth_tokens``: a token is a password for whatever name is given, and logs in as the user
   it is bound to (``"token:user"``; a bare token is ``default_token_user``'s), as
   RabbitMQ's OAuth 2 backend takes a token in the password field.

No password at all is a request for anonymous access, granted per ``anonymous_allowed``.
A refused login is logged (peer, user, protocol; never the password) and the caller is told
how long to hold its refusal back (``guard.LoginGuard``).

A password hash costs some 50 ms of CPU (scrypt): ``login`` has it computed off the event loop
by the caller's ``offload`` (the transport's worker thread; hashlib releases the GIL), so a
storm of logins never stalls the messages of the connections already in.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import structlog

from vibemq_server.auth.exposure import is_loopback_peer
from vibemq_server.auth.guard import LoginGuard
from vibemq_server.auth.passwords import dummy_hash, verify_password
from vibemq_server.auth.users import User, UsersFileError, UserStore
from vibemq_server.config import Config
from vibemq_server.core.permissions import FULL_ACCESS, NO_ACCESS, Access, Handle

log = structlog.get_logger("vibemq.auth")

#: the identity of a client let in without credentials
ANONYMOUS = "anonymous"
_CACHE_LIMIT = 10_000


class Outcome(Enum):
    ACCEPTED = "accepted"
    ANONYMOUS = "anonymous"
    #: no credentials where they are needed (MQTT 0x05, native AUTH_REQUIRED)
    CREDENTIALS_REQUIRED = "credentials_required"
    #: credentials that match nothing (MQTT 0x04, native AUTH_FAILED, AMQP 403)
    BAD_CREDENTIALS = "bad_credentials"


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: Outcome
    #: who the client is; None when refused
    user: str | None
    #: how long the refusal is to be held back, in seconds
    delay: float = 0.0

    @property
    def ok(self) -> bool:
        return self.user is not None


#: every anonymous login's verdict (frozen: one object, not a new one per CONNECT)
_ANONYMOUS_VERDICT = Verdict(Outcome.ANONYMOUS, ANONYMOUS)


#: Runs ``work`` somewhere that may block (a worker thread), then ``then(result)`` on the loop.
Offload = Callable[[Callable[[], bool], Callable[[bool], None]], None]

#: A hash verified off the loop: (the stored hash it was checked against, did it match)
_Known = tuple[str, bool]


def parse_tokens(entries: list[str], default_user: str) -> dict[str, str]:
    """token -> user: ``"token:user"`` (split at the last colon), or a bare token."""
    tokens: dict[str, str] = {}
    for entry in entries:
        token, sep, user = entry.rpartition(":")
        if sep and token and user:
            tokens[token] = user
        else:
            tokens[entry] = default_user
    return tokens


class Authenticator:
    def __init__(self, config: Config, now: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.store = UserStore(config.users_path)
        #: raises UsersFileError (with the path) when the file is corrupt: refused at start
        self.users: dict[str, User] = self.store.load()
        self._stamp = self.store.stamp()
        self.plain = dict(config.users) | dict(config.mqtt.users)
        self.tokens = parse_tokens(config.auth_tokens, config.default_token_user)
        self.guard = LoginGuard(
            config.auth_failure_delay_s,
            config.auth_failure_max_delay_s,
            config.connection_rate_limit,
            config.connection_rate_burst,
            now=now,
        )
        # Successful verifications, keyed by an HMAC (a per-process key) of the name, the
        # password and the stored hash: a reconnect costs no scrypt, a changed password
        # misses, and the table holds nothing a memory dump could replay elsewhere.
        self._cache_key = os.urandom(32)
        self._verified: set[bytes] = set()
        # Every live connection's Access of a users-file user (its handle), so that a reload
        # reaches them.
        self._granted: weakref.WeakSet[Handle] = weakref.WeakSet()
        self._unrestricted: dict[str, Access] = {}
        #: refused logins by (protocol, reason), for the metrics
        self.failures: dict[tuple[str, str], int] = {}

    def warn_plain_text(self) -> None:
        if self.plain:
            log.warning(
                "plain-text passwords in the config: move them to the users file "
                "(vibemq-server users add NAME)",
                users=sorted(self.plain),
            )

    # -- the users file ---------------------------------------------------------------------------

    @property
    def credentials_configured(self) -> bool:
        return bool(self.users or self.plain or self.tokens)

    def check_reload(self) -> bool:
        """Re-read the users file when it changed (one stat); True when reloaded."""
        stamp = self.store.stamp()
        if stamp == self._stamp:
            return False
        return self.reload()

    def reload(self) -> bool:
        """Re-read the users file; a corrupt one is logged and the users in force are kept."""
        stamp = self.store.stamp()
        try:
            users = self.store.load()
        except UsersFileError as exc:
            log.error("users file not reloaded", error=str(exc))
            self._stamp = stamp  # said once per change, not once per tick
            return False
        self._stamp = stamp
        self.users = users
        self._verified.clear()
        self._regrant()
        log.info("users reloaded", path=str(self.store.path), users=len(users))
        return True

    def _regrant(self) -> None:
        """Open connections of users-file users get their user's permissions as they are now;
        a user deleted meanwhile may do nothing more (what runs already, e.g. a consumer,
        goes on as in RabbitMQ; MQTT subscriptions are checked again when resumed)."""
        changed: set[str] = set()
        for handle in list(self._granted):
            access = handle.access
            stored = self.users.get(access.user)
            access.update(stored.permissions if stored is not None else NO_ACCESS)
            changed.add(access.user)
        if changed:
            log.info("permissions of open connections updated", users=sorted(changed))

    # -- logins -----------------------------------------------------------------------------------

    def anonymous_allowed(self, peer_host: str) -> bool:
        allow = self.config.allow_anonymous
        if allow is not None:
            return allow
        return not self.credentials_configured and is_loopback_peer(peer_host)

    def login(
        self,
        username: str | None,
        password: str | None,
        peer_host: str,
        protocol: str,
        then: Callable[[Verdict], None],
        offload: Offload,
    ) -> bool:
        """``authenticate``, with the password hash (if one must be computed) verified through
        ``offload``. ``then(verdict)`` is called before this returns True when no hash was
        needed (a cached login, a token, anonymous); else later, on the loop, and this returns
        False: the caller holds the client's further input until then."""
        encoded = None if password is None else self._hash_to_verify(username or "", password)
        if encoded is None or password is None:
            then(self.authenticate(username, password, peer_host, protocol))
            return True
        secret = password

        def work() -> bool:
            return verify_password(secret, encoded)

        def done(ok: bool) -> None:
            then(self.authenticate(username, secret, peer_host, protocol, (encoded, ok)))

        offload(work, done)
        return False

    def authenticate(
        self,
        username: str | None,
        password: str | None,
        peer_host: str,
        protocol: str,
        known: _Known | None = None,
    ) -> Verdict:
        """A login's verdict. ``password`` None asks for anonymous access (``username`` is
        then only a label: the client is the user ``anonymous``, whose permissions a users-file
        user of that name may set). ``known``: the hash already verified off the loop."""
        if password is None:
            if self.anonymous_allowed(peer_host):
                return _ANONYMOUS_VERDICT
            return self._refuse(Outcome.CREDENTIALS_REQUIRED, username, peer_host, protocol)
        user = self._check_password(username or "", password, known)
        if user is None:
            return self._refuse(Outcome.BAD_CREDENTIALS, username, peer_host, protocol)
        return Verdict(Outcome.ACCEPTED, user)

    def authenticate_token(self, token: str | None, peer_host: str, protocol: str) -> Verdict:
        """A native Connect's ``authToken`` (None: anonymous)."""
        if token is None:
            return self.authenticate(None, None, peer_host, protocol)
        user = self._check_token(token)
        if user is None:
            return self._refuse(Outcome.BAD_CREDENTIALS, None, peer_host, protocol)
        return Verdict(Outcome.ACCEPTED, user)

    def tags(self, user: str) -> list[str] | None:
        """A users-file user's tags; None for anyone else (anonymous, plain-config users,
        users named only by a token)."""
        stored = self.users.get(user)
        return list(stored.tags) if stored is not None else None

    def _hash_to_verify(self, username: str, password: str) -> str | None:
        """The stored hash this login must compute scrypt against (None: decided without)."""
        stored = self.users.get(username)
        if stored is not None:
            if self._digest(username, password, stored.password_hash) in self._verified:
                return None
            return stored.password_hash
        if username in self.plain or not self.users:
            return None
        return dummy_hash()  # an unknown name costs what a known one does

    def _check_password(self, username: str, password: str, known: _Known | None) -> str | None:
        stored = self.users.get(username)
        if stored is not None:
            if self._verify_cached(username, password, stored.password_hash, known):
                return username
        else:
            expected = self.plain.get(username)
            if expected is not None:
                if hmac.compare_digest(expected.encode(), password.encode()):
                    return username
            elif self.users and known is None:
                verify_password(password, dummy_hash())  # as slow as a known name's
        return self._check_token(password)

    def _check_token(self, token: str) -> str | None:
        found = None
        for candidate, user in self.tokens.items():
            if hmac.compare_digest(candidate.encode(), token.encode()):
                found = user  # no early exit: every token is compared
        return found

    def _digest(self, username: str, password: str, encoded: str) -> bytes:
        return hmac.new(
            self._cache_key,
            b"\0".join((username.encode(), password.encode(), encoded.encode())),
            hashlib.sha256,
        ).digest()

    def _verify_cached(
        self, username: str, password: str, encoded: str, known: _Known | None
    ) -> bool:
        digest = self._digest(username, password, encoded)
        if digest in self._verified:
            return True
        if known is not None and known[0] == encoded:
            ok = known[1]
        else:  # not verified yet, or the users file changed while it was
            ok = verify_password(password, encoded)
        if not ok:
            return False
        if len(self._verified) >= _CACHE_LIMIT:
            self._verified.clear()
        self._verified.add(digest)
        return True

    def _refuse(
        self, outcome: Outcome, username: str | None, peer_host: str, protocol: str
    ) -> Verdict:
        delay = self.guard.failed(peer_host)
        key = (protocol, outcome.value)
        self.failures[key] = self.failures.get(key, 0) + 1
        log.warning(
            "login refused",
            protocol=protocol,
            peer=peer_host,
            user=username,
            reason=outcome.value,
            failures=self.guard.failures(peer_host),
            delay_s=round(delay, 3),
        )
        return Verdict(outcome, None, delay)

    def access(self, user: str, client_id: str = "") -> Access:
        """What a logged-in user may do (``core.permissions``): a users-file user's own
        patterns; everyone else (anonymous, plain-config users, users named only by a token)
        everything, as before permissions existed."""
        stored = self.users.get(user)
        if stored is None:
            # Allowed everything, nothing to match: one shared Access per user, not one per
            # connection (an idle connection costs what it holds).
            access = self._unrestricted.get(user)
            if access is None:
                if len(self._unrestricted) >= 1024:
                    self._unrestricted.clear()
                access = self._unrestricted[user] = Access(FULL_ACCESS, user)
            return access
        access = Access(stored.permissions, user, client_id)
        self._granted.add(access.handle)
        return access

    def allow_connection(self, peer_host: str) -> bool:
        return self.guard.allow_connection(peer_host)
