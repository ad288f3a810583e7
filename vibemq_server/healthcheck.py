"""Container health check: a real VibeMQ protocol round trip, with nothing but the stdlib.

``python -m vibemq_server.healthcheck`` connects to the broker with a plain socket, sends
``Connect`` (with an ``authToken`` header when a token is configured) and then ``Ping``, and
exits 0 only if it gets ``ConnectAck`` and ``Pong`` back within the timeout (3 s by default).
Anything else (refused connection, ``Error`` reply, timeout, garbage) exits 1 with a one-line
reason on stderr, which Docker/Podman keep in the health log.

Environment:

- ``VIBEMQ_HEALTHCHECK_HOST``: address to probe (default ``127.0.0.1``).
- ``VIBEMQ_PORT``: port to probe (default 2925).
- ``VIBEMQ_HEALTHCHECK_TOKEN``: token to send; else the first of ``VIBEMQ_AUTH_TOKENS``
  (comma-separated, or a JSON list; of ``token:user``, the token); else no ``authToken``
  header.
- ``VIBEMQ_HEALTHCHECK_TIMEOUT``: overall timeout in seconds (default 3).
- TLS (``--tls``): on by itself when the plain VibeMQ listener is off
  (``VIBEMQ_TLS__PLAIN_VIBEMQ=false``); then the port is ``VIBEMQ_TLS__PORT`` (default 2926).
  The broker's certificate is not verified (the probe checks liveness, on loopback); a client
  certificate, for a broker that requires one: ``VIBEMQ_HEALTHCHECK_CERT`` and
  ``VIBEMQ_HEALTHCHECK_KEY``.
- ``VIBEMQ_HEALTHCHECK_USERNAME`` and ``VIBEMQ_HEALTHCHECK_PASSWORD``: a user to log in as
  (``username``/``password`` headers), for a broker with a users file and no token; used only
  when no token is given.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import ssl
import sys
import time
from collections.abc import Mapping, Sequence

from vibemq_server.protocol.codec import CommandType, FrameDecoder, Message, decode_body, encode
from vibemq_server.protocol.errors import ProtocolError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 2925
DEFAULT_TLS_PORT = 2926
DEFAULT_TIMEOUT = 3.0


class HealthCheckError(Exception):
    """The broker did not answer the way a healthy broker does."""


def token_from_env(env: Mapping[str, str]) -> str:
    """The token to authenticate with: the dedicated one, else the first configured one."""
    token = env.get("VIBEMQ_HEALTHCHECK_TOKEN", "").strip()
    if token:
        return token
    raw = env.get("VIBEMQ_AUTH_TOKENS", "").strip()
    candidates: list[object] = []
    if raw.startswith("["):  # the config loader also accepts a JSON list
        with contextlib.suppress(ValueError):
            parsed = json.loads(raw)
            if isinstance(parsed, list):
                candidates = list(parsed)
    else:
        candidates = list(raw.split(","))
    for candidate in candidates:
        if isinstance(candidate, str) and candidate.strip():
            # "token:user" binds a token to a user (auth.authenticator.parse_tokens's rule,
            # repeated here to keep this probe on the stdlib): the token is what is sent.
            token, sep, user = candidate.strip().rpartition(":")
            return token if sep and token and user else candidate.strip()
    return ""


def _read_reply(
    sock: socket.socket, decoder: FrameDecoder, pending: list[Message], deadline: float
) -> Message:
    """The next message from the broker, waiting no later than ``deadline``."""
    while not pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise HealthCheckError("timed out waiting for a reply")
        sock.settimeout(remaining)
        try:
            data = sock.recv(65536)
        except TimeoutError:
            raise HealthCheckError("timed out waiting for a reply") from None
        if not data:
            raise HealthCheckError("connection closed by the broker")
        try:
            pending.extend(decode_body(body) for body in decoder.feed(data))
        except ProtocolError as exc:
            raise HealthCheckError(f"malformed reply: {exc}") from None
    return pending.pop(0)


def _expect(
    sock: socket.socket,
    decoder: FrameDecoder,
    pending: list[Message],
    deadline: float,
    want: CommandType,
    msg_id: str,
) -> Message:
    """Wait for the reply ``want`` to request ``msg_id``; an Error reply fails the check."""
    while True:
        reply = _read_reply(sock, decoder, pending, deadline)
        if reply.type == CommandType.ERROR:
            raise HealthCheckError(
                f"broker answered {want.name} request with Error "
                f"{reply.error_code}: {reply.error_message}"
            )
        if reply.type == CommandType.DISCONNECT:
            reason = reply.headers.get("reason", "")
            raise HealthCheckError(f"broker sent Disconnect {reason}".rstrip())
        if reply.type == want and reply.id == msg_id:
            return reply
        # Anything else (e.g. an unrelated message) is skipped until the deadline.


def check(
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    token: str = "",
    timeout: float = DEFAULT_TIMEOUT,
    tls: ssl.SSLContext | None = None,
    login: tuple[str, str] | None = None,
) -> None:
    """Connect (over TLS with ``tls``), authenticate (with ``token``, else ``login``, a user
    name and password) and ping. Raises HealthCheckError or OSError on failure."""
    deadline = time.monotonic() + timeout
    suffix = f"{os.getpid()}-{int(time.time() * 1000)}"
    connect_id = f"health-connect-{suffix}"
    ping_id = f"health-ping-{suffix}"
    headers = {"clientVersion": "healthcheck"}
    if token:
        headers["authToken"] = token
    elif login is not None:
        headers["username"], headers["password"] = login
    decoder = FrameDecoder()
    pending: list[Message] = []
    with contextlib.ExitStack() as stack:
        sock = stack.enter_context(socket.create_connection((host, port), timeout=timeout))
        if tls is not None:
            sock = stack.enter_context(tls.wrap_socket(sock))
        sock.sendall(encode(Message(CommandType.CONNECT, connect_id, headers=headers)))
        _expect(sock, decoder, pending, deadline, CommandType.CONNECT_ACK, connect_id)
        sock.sendall(encode(Message(CommandType.PING, ping_id)))
        _expect(sock, decoder, pending, deadline, CommandType.PONG, ping_id)
        # The check already passed; a failed goodbye does not matter.
        with contextlib.suppress(OSError):
            sock.sendall(encode(Message(CommandType.DISCONNECT, f"health-bye-{suffix}")))


def main(argv: Sequence[str] | None = None) -> int:
    env = os.environ
    parser = argparse.ArgumentParser(
        prog="python -m vibemq_server.healthcheck",
        description="Exit 0 if a VibeMQ broker answers Connect and Ping, else 1.",
    )
    parser.add_argument("--host", default=env.get("VIBEMQ_HEALTHCHECK_HOST", DEFAULT_HOST))
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--token", default=None)
    parser.add_argument("--timeout", type=float, default=None)
    parser.add_argument("--tls", action="store_true", default=None, help="probe over TLS")
    args = parser.parse_args(argv)
    use_tls = args.tls or env.get("VIBEMQ_TLS__PLAIN_VIBEMQ", "").lower() in ("false", "0")

    try:
        if args.port is not None:
            port = args.port
        elif use_tls:
            port = int(env.get("VIBEMQ_TLS__PORT") or DEFAULT_TLS_PORT)
        else:
            port = int(env.get("VIBEMQ_PORT") or DEFAULT_PORT)
        timeout = (
            args.timeout
            if args.timeout is not None
            else float(env.get("VIBEMQ_HEALTHCHECK_TIMEOUT") or DEFAULT_TIMEOUT)
        )
    except ValueError as exc:
        print(f"unhealthy: bad setting: {exc}", file=sys.stderr)
        return 1
    token = args.token if args.token is not None else token_from_env(env)
    host: str = args.host
    username = env.get("VIBEMQ_HEALTHCHECK_USERNAME", "")
    login = (username, env.get("VIBEMQ_HEALTHCHECK_PASSWORD", "")) if username else None

    try:
        tls = _tls_context(env) if use_tls else None
        check(host, port, token, timeout, tls, login)
    except (HealthCheckError, OSError) as exc:
        print(f"unhealthy: {host}:{port}: {exc or type(exc).__name__}", file=sys.stderr)
        return 1
    print(f"healthy: {host}:{port}")
    return 0


def _tls_context(env: Mapping[str, str]) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    # A liveness probe of the broker on this host: whose certificate it is does not matter.
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    cert = env.get("VIBEMQ_HEALTHCHECK_CERT")
    if cert:
        ctx.load_cert_chain(cert, env.get("VIBEMQ_HEALTHCHECK_KEY") or None)
    return ctx


if __name__ == "__main__":
    sys.exit(main())
