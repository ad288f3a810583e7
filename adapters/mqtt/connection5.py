"""One MQTT 5.0 connection, sans-IO, and the choice of version at CONNECT.

:class:`MqttEntry` is the ``Session`` a new MQTT socket's transport drives: it reads the
first bytes up to the CONNECT's protocol level, then hands everything to an
``MqttConnection`` (3.1 / 3.1.1, connection.py, untouched) or an :class:`Mqtt5Connection`.
So the 3.1.1 path costs one forwarding call per read and nothing per packet.

:class:`Mqtt5Connection` is the 3.1.1 connection with the v5 codec (``codec5``), its own
state table (``states.TRANSITIONS5``) and v5 handlers: CONNACK with what the broker supports,
reason codes on every acknowledgement, topic aliases from the client, Receive Maximum on the
client's QoS 2 publishes, session expiry, will delay, subscription options, and a server
DISCONNECT with a reason code before every close it decides (``_drop``): 0x8E takeover, 0x8B
shutdown, 0x98 operator, 0x8D keep-alive, 0x81/0x82/0x93/0x94/0x95 for bad input. The
broker's redirection (``mqtt.server_reference``) is a CONNACK 0x9C / 0x9D, or 0x9C instead
of 0x8B at shutdown; Response Information (``mqtt.response_information``) goes in CONNACK.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable

from vibemq_server.adapters.mqtt.codec import MqttProtocolError, decode_remaining_length
from vibemq_server.adapters.mqtt.codec5 import Mqtt5Parser, encode5
from vibemq_server.adapters.mqtt.connection import (
    _PINGRESP,
    READ,
    WRITE,
    Login,
    MqttConnection,
    Server,
)
from vibemq_server.adapters.mqtt.packets import ConnackCode, Connect, Pingreq
from vibemq_server.adapters.mqtt.packets5 import (
    NO_PROPERTIES,
    Auth5,
    Connack5,
    Connect5,
    Disconnect5,
    Packet5,
    Properties,
    Puback5,
    Pubcomp5,
    Publish5,
    Pubrec5,
    Pubrel5,
    ReasonCode,
    RetainHandling,
    Suback5,
    Subscribe5,
    Unsuback5,
    Unsubscribe5,
)
from vibemq_server.adapters.mqtt.session5 import NEVER_EXPIRES, Mqtt5Session
from vibemq_server.adapters.mqtt.states import TRANSITIONS5, Event, Input, State
from vibemq_server.adapters.mqtt.topics import topic_to_address
from vibemq_server.protocol.bigcopy import BIG_FROM, FILL_FROM
from vibemq_server.server.transport import Link, SessionInfo

R = ReasonCode

_CONNACK_REASON = {
    ConnackCode.ACCEPTED: R.SUCCESS,
    ConnackCode.UNACCEPTABLE_PROTOCOL_VERSION: R.UNSUPPORTED_PROTOCOL_VERSION,
    ConnackCode.IDENTIFIER_REJECTED: R.CLIENT_IDENTIFIER_NOT_VALID,
    ConnackCode.SERVER_UNAVAILABLE: R.SERVER_UNAVAILABLE,
    ConnackCode.BAD_USERNAME_OR_PASSWORD: R.BAD_USER_NAME_OR_PASSWORD,
    ConnackCode.NOT_AUTHORIZED: R.NOT_AUTHORIZED,
}

#: why the connection closes (``_drop``'s reason) -> the server DISCONNECT's reason code
_DROP_REASON: dict[str, int] = {
    "keepalive_timeout": R.KEEP_ALIVE_TIMEOUT,
    "session_taken_over": R.SESSION_TAKEN_OVER,
    "storage_failure": R.UNSPECIFIED_ERROR,
    "packet_timeout": R.MALFORMED_PACKET,
    "protocol_violation": R.PROTOCOL_ERROR,
}


#: ``mqtt.server_reference_mode`` -> the CONNACK refusing every v5 CONNECT (section 4.11)
_REDIRECT: dict[str, int] = {"use_another": R.USE_ANOTHER_SERVER, "moved": R.SERVER_MOVED}


def response_information(template: str, client_id: str) -> str | None:
    """The Response Information for a client (``%c``: its client id); None when there is
    none: no template, or a client id with ``/``, ``+`` or ``#``, whose prefix would lie
    inside another client's (``a/b`` in ``a``'s) or could not be published to."""
    if not template:
        return None
    if "%c" in template and any(c in client_id for c in "/+#"):
        return None
    return template.replace("%c", client_id)


def _ack(kind: int, pid: int, code: int) -> bytes:
    """PUBACK (0x40) / PUBREC (0x50) / PUBREL (0x62) / PUBCOMP (0x70): short when 0."""
    if code == 0:
        return bytes((kind, 2)) + pid.to_bytes(2, "big")
    return bytes((kind, 3)) + pid.to_bytes(2, "big") + bytes((code,))


def _is_utf8(payload: bytes) -> bool:
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class Mqtt5Connection(MqttConnection):
    """Implements the transport's ``Session`` for one MQTT 5.0 client."""

    __slots__ = (
        "_said_disconnect",
        "alias_max_in",
        "aliases_in",
        "parser5",
        "problem_info",
        "receive_max_in",
        "session_expiry",
        "will5",
    )

    def __init__(self, link: Link, server: Server) -> None:
        super().__init__(link, server)
        cfg = server.cfg
        self.parser5 = Mqtt5Parser(cfg.max_packet_size)
        self.parser5.defer_from = BIG_FROM  # (as for 3.1.1: _join_off_loop)
        self.parser5.fill_from = FILL_FROM  # (as for 3.1.1: link.read_into)
        self._table = TRANSITIONS5[State.AWAIT_CONNECT]
        #: the client's topic aliases: alias -> topic
        self.aliases_in: dict[int, str] = {}
        self.alias_max_in = cfg.topic_alias_maximum
        self.receive_max_in = cfg.receive_maximum
        #: the client asked for reason strings (Request Problem Information, default 1)
        self.problem_info = True
        self.session_expiry = 0
        self.will5: Connect5 | None = None
        self._said_disconnect = False

    def _buffered(self) -> int:
        return self.parser5.buffered

    # -- the state table -----------------------------------------------------------------------

    def _fire(self, event: Input) -> None:
        self._state = TRANSITIONS5[self._state][event]
        self._table = TRANSITIONS5[self._state]

    def data_received(self, data: bytes) -> None:
        if self._state is State.CLOSED:
            return
        self.last_rx = self.link.time()
        error: MqttProtocolError | None = None
        try:
            packets = self.parser5.feed(data)
        except MqttProtocolError as exc:
            packets = list(exc.packets)  # type: ignore[arg-type]
            error = exc
        unjoined = self.parser5.unjoined
        if unjoined is not None:
            self.parser5.unjoined = None
            if self._join_off_loop(unjoined, packets, error):  # type: ignore[arg-type]
                return
        fill = self.parser5.filling
        if fill is not None:
            self.link.read_into(fill)
        if self._authenticating and self._held is not None:
            held, rest = self._held
            self._held = (held + packets, rest)  # type: ignore[operator]
            self._held_error = self._held_error or error
            return
        if self._process(packets, 0):
            self._after_read(bool(packets), error)
        else:
            self._held_error = error

    def _process(self, packets: list[Packet5], start: int) -> bool:  # type: ignore[override]
        server = self.server
        for index in range(start, len(packets)):
            packet = packets[index]
            kind = type(packet)
            following = self._table.get(kind)
            if following is None:
                if self._state is not State.CLOSED:
                    self._violation(f"{kind.__name__.upper()} not allowed in {self._state.value}")
                break
            if following is not self._state:
                self._fire(kind)
            _HANDLERS5[kind](self, packet)
            if self._authenticating:
                self._held = (packets, index + 1)  # type: ignore[assignment]
                return False
            if server.congested:
                self._hold(packets, index + 1)  # type: ignore[arg-type]
                return False
        return True

    # -- server DISCONNECT -------------------------------------------------------------------------

    def _say_disconnect(self, code: int, reason: str = "", server: str | None = None) -> None:
        if self._said_disconnect or self._state is not State.CONNECTED:
            return
        self._said_disconnect = True
        text = reason[:200] if reason and self.problem_info else None
        props = Properties(reason_string=text, server_reference=server)
        self.link.send(encode5(Disconnect5(code, props)))

    def _drop(self, reason: str) -> None:
        if self._state is State.CONNECTED:
            code = _DROP_REASON.get(reason)
            if code is not None:
                self._say_disconnect(code, reason)
        super()._drop(reason)

    def _malformed(self, exc: MqttProtocolError) -> None:
        code = exc.code.reason_code
        if self._state is State.AWAIT_CONNECT:
            self.server.stats.error(exc.code.value)
            self.log.warning("malformed packet", code=exc.code.value, error=exc.message)
            self.link.send(encode5(Connack5(code)))
            self._fire(Event.REFUSED)
            self.link.close()
            return
        self._say_disconnect(code, exc.message)
        super()._malformed(exc)

    def _refuse_input(self, code: int, message: str) -> None:
        """Bad input the codec could not see (topic alias, receive maximum, ...)."""
        self.server.stats.error(ReasonCode(code).name.lower())
        self.log.warning("protocol error", code=hex(code), error=message)
        self._say_disconnect(code, message)
        self._drop("bad_input")

    def shutdown(self, reason: str) -> None:
        reference = self.server.cfg.server_reference
        if reference:
            # Section 4.11: a Server Reference goes with 0x9C (use another server, for
            # now), not with 0x8B; client libraries look for it only there.
            self._say_disconnect(R.USE_ANOTHER_SERVER, server=reference)
        else:
            self._say_disconnect(R.SERVER_SHUTTING_DOWN)
        self.will5 = None
        super().shutdown(reason)

    def close_by_operator(self, reason: str) -> None:
        self.log.info("connection closed by operator", reason=reason)
        self._say_disconnect(R.ADMINISTRATIVE_ACTION, reason)
        self.shutdown(reason)

    def describe(self) -> SessionInfo:
        info = super().describe()
        details = dict(info.details)
        details["protocol_version"] = 5
        details["session_expiry_s"] = self.session_expiry
        return dataclasses.replace(info, details=details)

    # -- closing ---------------------------------------------------------------------------------

    def _end(self, publish_will: bool) -> None:
        session = self.session
        will, self.will5 = self.will5, None
        super()._end(publish_will=False)
        if isinstance(session, Mqtt5Session) and session.link is None and not session.clean:
            self.server.expire_later(session)
        if publish_will and will is not None:
            self._will(will, session)

    def _will(self, will: Connect5, session: object) -> None:
        topic = will.will_topic
        assert topic is not None
        if self.server.publish_denied(topic) or not self.access.allowed(
            WRITE, topic_to_address(topic)
        ):
            self.log.debug("will denied", topic=topic)
            return
        server = self.server
        props = will.will_properties

        def publish() -> None:
            if isinstance(session, Mqtt5Session):
                session.will_timer = None
            server.route(
                topic, will.will_payload, will.will_qos, will.will_retain, pause=False, props=props
            )

        delay = props.will_delay_interval or 0
        if self.session_expiry != NEVER_EXPIRES:
            delay = min(delay, self.session_expiry)
        if delay > 0 and isinstance(session, Mqtt5Session) and not session.clean:
            session.will_timer = server.call_later(float(delay), publish)
        else:
            publish()

    # -- packet handlers -----------------------------------------------------------------------

    def on_connect5(self, packet: Connect5) -> None:
        props = packet.properties
        if props.authentication_method is not None:
            # No enhanced authentication mechanism (section 4.12): refused.
            self.log.info(
                "connect refused: enhanced authentication", method=props.authentication_method
            )
            self.link.send(encode5(Connack5(R.BAD_AUTHENTICATION_METHOD)))
            self._fire(Event.REFUSED)
            self.link.close()
            return
        self.problem_info = props.request_problem_information != 0
        legacy = Connect(
            packet.client_id,
            packet.clean_start,
            packet.keep_alive,
            username=packet.username,
            password=packet.password,
        )
        self._login(legacy, lambda login: self._accept_or_refuse5(packet, login))

    def _accept_or_refuse5(self, packet: Connect5, login: Login) -> None:
        server = self.server
        cfg = server.cfg
        code, delay, access = login
        client_id = packet.client_id
        if code is ConnackCode.ACCEPTED and len(client_id) > cfg.max_client_id_length:
            code = ConnackCode.IDENTIFIER_REJECTED
        if code is ConnackCode.ACCEPTED and cfg.server_reference:
            redirect = _REDIRECT.get(cfg.server_reference_mode)
            if redirect is not None:
                self.log.info("connect redirected", code=hex(redirect), server=cfg.server_reference)
                self._fire(Event.REFUSED)
                reference = Properties(server_reference=cfg.server_reference)
                self.link.send(encode5(Connack5(redirect, False, reference)))
                self.link.close()
                return
        if code is not ConnackCode.ACCEPTED:
            self.log.warning("connect refused", code=code.name, client_id=client_id)
            self._fire(Event.REFUSED)
            refusal = encode5(Connack5(_CONNACK_REASON[code]))

            def refuse() -> None:
                self.link.send(refusal)
                self.link.close()

            if delay <= 0:
                refuse()
            else:
                self.link.pause_reading()
                server.call_later(delay, refuse)
            return
        props = packet.properties
        assigned = None
        if not client_id:
            client_id = assigned = f"auto-{uuid.uuid4().hex}"
        old = server.sessions.get(client_id)
        if old is not None:
            old.take_over()
            if packet.clean_start and server.sessions.get(client_id) is old:
                server.end_session(old)
        expiry = props.session_expiry_interval or 0
        self.session_expiry = expiry
        session, resumed = server.open_session(client_id, expiry == 0, v5=True)
        assert isinstance(session, Mqtt5Session)
        assert access is not None
        self.access = access
        self.session = session
        session.expiry_s = expiry
        session.max_inflight = min(cfg.max_inflight, props.receive_maximum or 65_535)
        session.max_packet_out = props.maximum_packet_size or session.max_packet_out
        session.alias_max_out = props.topic_alias_maximum or 0
        if resumed:
            self._recheck_filters(session, access)
        self.will5 = packet if packet.has_will else None
        keep_alive = packet.keep_alive
        server_keep_alive = None
        if cfg.server_keep_alive and (keep_alive == 0 or keep_alive > cfg.server_keep_alive):
            keep_alive = server_keep_alive = cfg.server_keep_alive
        self.keep_alive = keep_alive
        self._fire(Event.ACCEPTED)
        self.link.send(
            encode5(
                Connack5(
                    R.SUCCESS,
                    resumed,
                    Properties(
                        receive_maximum=self.receive_max_in,
                        maximum_packet_size=cfg.max_packet_size,
                        topic_alias_maximum=self.alias_max_in,
                        retain_available=1,
                        wildcard_subscription_available=1,
                        subscription_identifier_available=1,
                        shared_subscription_available=1,
                        assigned_client_identifier=assigned,
                        server_keep_alive=server_keep_alive,
                        response_information=(
                            response_information(cfg.response_information, client_id)
                            if props.request_response_information
                            else None
                        ),
                    ),
                )
            )
        )
        session.user = access.user
        session.attach(self.link, self)
        session.start_delivery()
        self.log.debug("connected", version=5, clean_start=packet.clean_start, resumed=resumed)

    def on_publish5(self, packet: Publish5) -> None:
        self._published = True
        self._stats.messages_received += 1
        session = self.session
        assert session is not None
        props = packet.properties
        topic = packet.topic
        alias = props.topic_alias
        if alias is not None:
            if alias == 0 or alias > self.alias_max_in:
                self._refuse_input(R.TOPIC_ALIAS_INVALID, f"topic alias {alias}")
                return
            if topic:
                self.aliases_in[alias] = topic
            else:
                known = self.aliases_in.get(alias)
                if known is None:
                    self._refuse_input(R.PROTOCOL_ERROR, f"topic alias {alias} not set")
                    return
                topic = known
        qos = packet.qos
        pid = packet.packet_id or 0
        if qos == 2:
            if pid in session.inbound_qos2:
                self._acknowledge(_ack(0x50, pid, 0), durable=False)
                return
            if len(session.inbound_qos2) >= self.receive_max_in:
                self._refuse_input(
                    R.RECEIVE_MAXIMUM_EXCEEDED,
                    f"more than {self.receive_max_in} QoS 2 publishes unacknowledged",
                )
                return
        code = 0
        durable = False
        if props.payload_format_indicator == 1 and not _is_utf8(packet.payload):
            code = R.PAYLOAD_FORMAT_INVALID
        elif self.server.publish_denied(topic) or not (
            self.access.everything or self.access.allowed(WRITE, self.server.address_of(topic))
        ):
            self.log.debug("publish refused", topic=topic)
            code = R.NOT_AUTHORIZED
        else:
            durable = self.server.route(
                topic,
                packet.payload,
                qos,
                packet.retain,
                session,
                props=None if props is NO_PROPERTIES else props,
            )
        if qos == 1:
            self._acknowledge(_ack(0x40, pid, code), durable)
        elif qos == 2:
            if code < 0x80:
                session.remember_inbound_qos2(pid)
            self._acknowledge(_ack(0x50, pid, code), durable)

    def on_puback5(self, packet: Puback5) -> None:
        assert self.session is not None
        if self.session.puback(packet.packet_id):
            self._acked_any = True

    def on_pubrec5(self, packet: Pubrec5) -> None:
        session = self.session
        assert session is not None
        session.pubrec(packet.packet_id)
        self._acked_any = True
        if packet.reason_code >= 0x80:
            session.pubcomp(packet.packet_id)  # the flow ends here (section 4.3.3)
            return
        self.link.send(_ack(0x62, packet.packet_id, 0))

    def on_pubrel5(self, packet: Pubrel5) -> None:
        session = self.session
        assert session is not None
        pid = packet.packet_id
        code = 0 if pid in session.inbound_qos2 else R.PACKET_IDENTIFIER_NOT_FOUND
        session.inbound_qos2.discard(pid)
        self._acknowledge(_ack(0x70, pid, code), durable=False)

    def on_pubcomp5(self, packet: Pubcomp5) -> None:
        assert self.session is not None
        self.session.pubcomp(packet.packet_id)
        self._acked_any = True

    def on_subscribe5(self, packet: Subscribe5) -> None:
        session = self.session
        assert isinstance(session, Mqtt5Session)
        server = self.server
        sub_ids = packet.properties.subscription_identifiers
        sub_id = sub_ids[0] if sub_ids else 0
        codes: list[int] = []
        for topic_filter, options in packet.subscriptions:
            if topic_filter.startswith("$share/") and options.no_local:
                self._refuse_input(R.PROTOCOL_ERROR, "No Local on a shared subscription")
                return
            if not self.access.allowed(READ, topic_to_address(_real_filter(topic_filter))):
                codes.append(R.NOT_AUTHORIZED)
                continue
            existed = topic_filter in session.filters
            granted = server.subscribe(session, topic_filter, options.qos, options, sub_id)
            codes.append(granted)
            if granted >= 0x80 or topic_filter.startswith("$share/"):
                continue
            handling = options.retain_handling
            if handling == RetainHandling.SEND or (
                handling == RetainHandling.SEND_IF_NEW and not existed
            ):
                server.send_retained(session, topic_filter, granted)
        server.save_session(session)
        self.link.send(encode5(Suback5(packet.packet_id, tuple(codes))))
        session.refill()

    def on_unsubscribe5(self, packet: Unsubscribe5) -> None:
        session = self.session
        assert session is not None
        codes = []
        for topic_filter in packet.topic_filters:
            existed = topic_filter in session.filters
            self.server.unsubscribe(session, topic_filter)
            codes.append(R.SUCCESS if existed else R.NO_SUBSCRIPTION_EXISTED)
        self.server.save_session(session)
        self.link.send(encode5(Unsuback5(packet.packet_id, tuple(codes))))

    def on_disconnect5(self, packet: Disconnect5) -> None:
        # (The table has moved us to CLOSED already.)
        session = self.session
        expiry = packet.properties.session_expiry_interval
        if expiry is not None and isinstance(session, Mqtt5Session):
            if self.session_expiry == 0 and expiry != 0:
                # Section 3.14.2.2.2: a protocol error; the connection closes anyway.
                self.log.warning("DISCONNECT sets a session expiry the CONNECT had not")
            else:
                self.session_expiry = session.expiry_s = expiry
                if expiry == 0 and not session.clean:
                    self.server.end_session(session)  # ends with this connection
                    self.session = None
        self._end(publish_will=packet.reason_code == R.DISCONNECT_WITH_WILL)
        self.link.close()

    def on_auth5(self, packet: Auth5) -> None:
        # No AUTH exchange was started (CONNECT had no Authentication Method).
        self._refuse_input(R.PROTOCOL_ERROR, "AUTH without enhanced authentication")

    def taken_over(self) -> None:
        self.log.info("session taken over by a new connection")
        self._drop("session_taken_over")


def _real_filter(topic_filter: str) -> str:
    """The filter of a shared subscription (``$share/{group}/{filter}``), else itself."""
    if topic_filter.startswith("$share/"):
        _, _, rest = topic_filter[len("$share/") :].partition("/")
        return rest or topic_filter
    return topic_filter


def _pingreq(conn: Mqtt5Connection, packet: Pingreq) -> None:
    conn.link.send(_PINGRESP)


_HANDLERS5: dict[type, Callable[[Mqtt5Connection, Packet5], None]] = {
    Connect5: Mqtt5Connection.on_connect5,  # type: ignore[dict-item]
    Publish5: Mqtt5Connection.on_publish5,  # type: ignore[dict-item]
    Puback5: Mqtt5Connection.on_puback5,  # type: ignore[dict-item]
    Pubrec5: Mqtt5Connection.on_pubrec5,  # type: ignore[dict-item]
    Pubrel5: Mqtt5Connection.on_pubrel5,  # type: ignore[dict-item]
    Pubcomp5: Mqtt5Connection.on_pubcomp5,  # type: ignore[dict-item]
    Subscribe5: Mqtt5Connection.on_subscribe5,  # type: ignore[dict-item]
    Unsubscribe5: Mqtt5Connection.on_unsubscribe5,  # type: ignore[dict-item]
    Pingreq: _pingreq,  # type: ignore[dict-item]
    Disconnect5: Mqtt5Connection.on_disconnect5,  # type: ignore[dict-item]
    Auth5: Mqtt5Connection.on_auth5,  # type: ignore[dict-item]
}


# --------------------------------------------------------------------------------------------
# Choosing the version


class MqttEntry:
    """The ``Session`` of a new MQTT socket until its CONNECT's protocol level is known:
    level 5 (name ``MQTT``) gets an :class:`Mqtt5Connection`, anything else the 3.1.1
    ``MqttConnection`` (which refuses what it does not speak)."""

    # (two slots: the link and the server are the connection's, "decided" is no buffer)
    __slots__ = ("_buffer", "conn")

    def __init__(self, link: Link, server: Server) -> None:
        self.conn: MqttConnection = MqttConnection(link, server)
        self._buffer: bytes | None = b""  # None: decided

    def data_received(self, data: bytes) -> None:
        before = self._buffer
        if before is None:
            self.conn.data_received(data)
            return
        buf = before + data
        version = _sniff(buf)
        if version is None:
            self._buffer = buf
            return
        self._buffer = None
        conn = self.conn
        if version == 5:
            conn = self.conn = Mqtt5Connection(conn.link, conn.server)
        # The transport drives the connection from now on: this picker is dropped (an idle
        # connection keeps no object for a decision taken once).
        conn.link.replace_session(conn)
        conn.data_received(buf)

    def writable_again(self) -> None:
        self.conn.writable_again()

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.connection_lost(exc)

    def check_timers(self, now: float, keepalive: float, frame_timeout: float) -> None:
        self.conn.check_timers(now, keepalive, frame_timeout)

    def shutdown(self, reason: str) -> None:
        self.conn.shutdown(reason)

    def describe(self) -> SessionInfo:
        return self.conn.describe()

    def close_by_operator(self, reason: str) -> None:
        self.conn.close_by_operator(reason)


_V5_HEAD = b"\x00\x04MQTT\x05"


def _sniff(buf: bytes) -> int | None:
    """5 once the first bytes are a CONNECT of protocol ``MQTT`` level 5, 4 once they
    cannot be, None while they do not tell yet."""
    if not buf:
        return None
    if buf[0] != 0x10:
        return 4
    try:
        decoded = decode_remaining_length(buf, 1)
    except MqttProtocolError:
        return 4
    if decoded is None:
        return None
    start = 1 + decoded[1]
    head = buf[start : start + len(_V5_HEAD)]
    if len(head) < len(_V5_HEAD):
        return None if _V5_HEAD.startswith(head) else 4
    return 5 if head == _V5_HEAD else 4


__all__ = ["Mqtt5Connection", "MqttEntry"]
