"""The handlers of channel 0: the protocol header, the handshake (start-ok with PLAIN,
AMQPLAIN, or EXTERNAL over TLS with a client certificate, tune-ok, open) and
connection.close / close-ok from the client.

Which of them each connection state accepts, and the state that follows, is in
``states.TRANSITIONS``; the connection moves before the handler runs, and a handler that
fails raises ``AmqpError`` (the connection answers with connection.close).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from pamqp import commands

from vibemq_server.adapters.amqp.base import ConnectionBase
from vibemq_server.adapters.amqp.codec import (
    PROTOCOL_HEADER,
    AmqpError,
    ProtocolHeader,
    ReplyCode,
    decode_table,
    encode_method,
    text,
)
from vibemq_server.adapters.amqp.states import Event
from vibemq_server.auth.authenticator import Outcome, Verdict
from vibemq_server.server.connlog import bind_lazily

#: A refused login without ``authentication_failure_close`` loses its socket after this long,
#: with no close method (RabbitMQ's ``?SILENT_CLOSE_DELAY``: repeated guesses are slowed down).
AUTH_FAILURE_DELAY_S = 3.0

_CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "direct_reply_to": False,
}


class HandshakeMethods(ConnectionBase):
    __slots__ = ()

    def on_protocol_header(self, frame: ProtocolHeader) -> None:
        if not frame.ok:
            self.log.info("wrong protocol header", header=frame.raw.hex())
            self.send(PROTOCOL_HEADER)
            self._fire(Event.REFUSED)
            self.link.close()
            return
        self.send(
            encode_method(
                0,
                commands.Connection.Start(
                    server_properties={
                        "product": "VibeMQ",
                        "platform": "Python",
                        "version": "0.1",
                        "capabilities": cast(Any, _CAPABILITIES),
                    },
                    # EXTERNAL (RabbitMQ's rabbitmq_auth_mechanism_ssl) only when a verified
                    # client certificate came with the TLS handshake.
                    mechanisms=(
                        "EXTERNAL PLAIN AMQPLAIN" if self.link.peer_identity else "PLAIN AMQPLAIN"
                    ),
                    locales="en_US",
                ),
            )
        )

    def on_start_ok(self, method: commands.Connection.StartOk) -> None:
        props = method.client_properties or {}
        self.client_properties = dict(props)
        caps = props.get("capabilities")
        if isinstance(caps, dict):
            self.capabilities = caps
        mechanism = text(method.mechanism)
        response = method.response
        raw = response.encode("latin-1") if isinstance(response, str) else bytes(response or b"")
        if mechanism == "PLAIN":
            parts = raw.split(b"\x00")
            if len(parts) != 3:
                raise AmqpError(ReplyCode.ACCESS_REFUSED, "ACCESS_REFUSED - bad PLAIN response", 0)
            username, password = (
                parts[1].decode("utf-8", "replace"),
                parts[2].decode("utf-8", "replace"),
            )
        elif mechanism == "EXTERNAL" and self.link.peer_identity:
            # The certificate was verified in the handshake: its CN is the user, whatever
            # the response names (as RabbitMQ does with ssl_cert_login_from = common_name).
            identity = self.link.peer_identity
            self._logged_in(identity, identity, anonymous=False)
            return
        elif mechanism == "AMQPLAIN":
            try:
                table = decode_table(len(raw).to_bytes(4, "big") + raw)
            except AmqpError:
                table = {}
            username = text(table.get("LOGIN"))
            password = text(table.get("PASSWORD"))
        else:
            # RabbitMQ: 503 for a mechanism it does not offer (rabbit_reader).
            raise AmqpError(
                ReplyCode.COMMAND_INVALID,
                f"COMMAND_INVALID - unknown authentication mechanism {mechanism!r} "
                "(PLAIN, AMQPLAIN)",
                0,
            )

        def decide(verdict: Verdict) -> None:
            if verdict.user is None:
                self.log.warning("authentication refused", user=username)
                self._refuse_login(mechanism, verdict.delay)
            else:
                self._logged_in(username, verdict.user, verdict.outcome is Outcome.ANONYMOUS)

        self._login(username, password, decide)

    def _login(self, username: str, password: str, decide: Callable[[Verdict], None]) -> None:
        """``decide`` on the credentials' verdict: now, or once a password hash verified off
        the loop is in (the connection's later frames wait for it: ``login_decided``)."""
        if not self.server.login(
            username,
            password,
            self.link.peer_host,
            lambda verdict: self._verdict_in(decide, verdict),
            self.link.offload,
        ):
            self.awaiting_login = True
            self.link.pause_reading()

    def _verdict_in(self, decide: Callable[[Verdict], None], verdict: Verdict) -> None:
        if self.awaiting_login:
            self.login_decided(lambda: decide(verdict))
        else:
            decide(verdict)

    def log_extra(self) -> dict[str, object]:
        """What this connection's log lines add once logged in (``bind_lazily``)."""
        return {"user": self.user}

    def _logged_in(self, username: str, user: str, anonymous: bool) -> None:
        """``username`` as the client named itself; ``user`` whose permissions apply."""
        self.username = username
        self.user = user
        self.anonymous = anonymous
        self.access = self.server.access(user)
        self.log = bind_lazily(self.link.log, self)
        cfg = self.server.cfg
        self.send(
            encode_method(
                0,
                commands.Connection.Tune(
                    channel_max=cfg.channel_max, frame_max=cfg.frame_max, heartbeat=cfg.heartbeat_s
                ),
            )
        )

    def _refuse_login(self, mechanism: str, delay: float = 0.0) -> None:
        """As RabbitMQ: connection.close 403 to a client that announced
        ``authentication_failure_close`` (held back ``delay`` seconds, reading paused, when
        its address failed before); any other loses its socket silently, later
        (``check_timers`` closes it ``AUTH_FAILURE_DELAY_S`` after ``refused_at``)."""
        if self.capabilities.get("authentication_failure_close") is True:
            text = (
                f"ACCESS_REFUSED - Login was refused using authentication mechanism {mechanism}."
                " For details see the broker logfile."
            )
            if delay <= 0:
                raise AmqpError(ReplyCode.ACCESS_REFUSED, text, 0)
            self.link.pause_reading()

            def refuse() -> None:
                self.link.resume_reading()  # for the client's close-ok
                self._fail(AmqpError(ReplyCode.ACCESS_REFUSED, text, 0))

            self.link.call_later(delay, refuse)
            return
        self._fire(Event.REFUSED)
        self.link.pause_reading()
        self.refused_at = self.link.time()

    def on_update_secret(self, method: commands.Connection.UpdateSecret) -> None:
        # The new secret is checked as a login's password would be; a refusal costs the
        # connection (530), as RabbitMQ answers when one of its auth backends refuses.
        # An anonymous login (guest) has no secret to check: any is taken, as RabbitMQ's
        # internal backend takes any.
        reason = text(method.reason)
        if self.anonymous:
            self._secret_updated(reason)
            return

        def decide(verdict: Verdict) -> None:
            if verdict.user != self.user:
                self.log.warning("secret update refused")
                raise AmqpError(
                    ReplyCode.NOT_ALLOWED,
                    "NOT_ALLOWED - New secret was refused by one of the backends",
                    0,
                    10,
                    70,
                )
            self._secret_updated(reason)

        self._login(self.username, text(method.new_secret), decide)

    def _secret_updated(self, reason: str) -> None:
        self.log.info("secret updated", reason=reason)
        self.send(encode_method(0, commands.Connection.UpdateSecretOk()))

    def on_tune_ok(self, method: commands.Connection.TuneOk) -> None:
        cfg = self.server.cfg
        frame_max = method.frame_max or cfg.frame_max
        if frame_max < 4096 or frame_max > cfg.frame_max:
            raise AmqpError(
                ReplyCode.NOT_ALLOWED,
                f"NOT_ALLOWED - frame_max {frame_max} outside 4096..{cfg.frame_max}",
                0,
            )
        self.frame_max = frame_max
        self.parser.max_frame_size = frame_max
        self.channel_max = min(method.channel_max or cfg.channel_max, cfg.channel_max)
        self.heartbeat = method.heartbeat

    def on_open(self, method: commands.Connection.Open) -> None:
        if text(method.virtual_host) != "/":
            raise AmqpError(
                ReplyCode.NOT_ALLOWED,
                f"NOT_ALLOWED - vhost {text(method.virtual_host)!r} not found (only '/')",
                0,
                10,
                40,
            )
        self.send(encode_method(0, commands.Connection.OpenOk()))
        self.log.debug("connection open", heartbeat=self.heartbeat, frame_max=self.frame_max)

    def on_close(self, method: commands.Connection.Close) -> None:
        self.send(encode_method(0, commands.Connection.CloseOk()))
        self._release_all()
        self.link.close()

    def on_close_ok(self, method: commands.Connection.CloseOk) -> None:
        self.link.close()
