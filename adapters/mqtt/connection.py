"""One MQTT connection, sans-IO: bytes in, packets handled, bytes out through a ``Link``.

``MqttConnection`` is the ``Session`` that the shared ``StreamTransport`` drives (see
vibemq_server/server/transport.py): it owns no socket and no event loop. It turns the bytes
it is given into packets (``codec.MqttParser``), moves through the state table of
``states.py`` and hands each packet to its handler (``_HANDLERS``); what it answers goes to
``Link.send``. Anything a state does not accept (a packet before CONNECT, a second CONNECT, a
server-to-client packet, malformed input) closes the connection with a log line, as 3.1.1
requires; the will is published then, as on every close not preceded by DISCONNECT.

Flow control: a paused socket makes deliveries wait in the session's queue; a publisher whose
packets reach a subscriber that falls behind stops being read until that subscriber drains
(at most ``max_publisher_pause_s``); publishers are paused while the broker is over its
memory bound.

What the connection uses of the broker's MQTT side is the ``Server`` base class below
(``server.MqttServer`` subclasses it), so this module imports nothing above it.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from typing import Protocol, cast

from structlog.typing import FilteringBoundLogger

from vibemq_server.adapters.mqtt.codec import MqttParser, MqttProtocolError, encode
from vibemq_server.adapters.mqtt.packets import (
    PROTOCOL_LEVEL_V311,
    Connack,
    ConnackCode,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
)
from vibemq_server.adapters.mqtt.packets5 import Properties, SubOptions
from vibemq_server.adapters.mqtt.session import MqttSession
from vibemq_server.adapters.mqtt.states import RUNNING, TRANSITIONS, Event, Input, State
from vibemq_server.adapters.mqtt.topics import topic_to_address
from vibemq_server.auth.authenticator import Offload
from vibemq_server.config import MqttConfig
from vibemq_server.core import QueueManager
from vibemq_server.core.durable_replies import DurableReplies
from vibemq_server.core.permissions import BEFORE_LOGIN, Access, Operation
from vibemq_server.core.routing import AddressSink
from vibemq_server.protocol.bigcopy import BIG_FROM, FILL_FROM, Unjoined
from vibemq_server.server.connlog import bind_lazily
from vibemq_server.server.stall import StallClock
from vibemq_server.server.stats import ProtocolStats
from vibemq_server.server.transport import ConsumerInfo, Link, SessionInfo

_PINGRESP = encode(Pingresp())
#: a SUBACK's refusal of one filter
_REFUSED = 0x80
WRITE, READ = Operation.WRITE, Operation.READ
#: refused publishes of a connection logged at info; the rest at debug
_LOUD_REFUSALS = 10


#: a CONNECT's verdict: the CONNACK code, how long to hold a refusal, what the user may do
Login = tuple[ConnackCode, float, Access | None]


class Timer(Protocol):
    def cancel(self) -> None: ...


class Server(AddressSink):
    """What a connection uses of the MQTT side of the broker: settings, the session registry,
    subscriptions, routing, and a timer (the longest pause of a publisher); the core's
    ``AddressSink`` of MQTT (``deliver``).
    ``server.MqttServer`` is its one implementation and overrides every method.

    A base class, not a Protocol: the compiled build calls a class's methods and reads its
    attributes natively (through its vtable), a Protocol's generically (a lookup by name and
    boxed arguments, ~3 µs a 64 KiB QoS 1 message in all: ``route``, ``publish_denied``,
    ``stats``, ``congested``, ``manager``). Here, not in server.py: that one imports this."""

    cfg: MqttConfig
    manager: QueueManager
    #: sessions whose QoS 0 backlog grew during the last route(): the publisher pauses
    congested: list[MqttSession]
    #: over TLS, the client certificate's identity is the username (config ``tls``)
    use_identity_as_username: bool
    #: the MQTT counters (messages in, protocol errors), shared by every connection
    stats: ProtocolStats
    #: client id -> session
    sessions: dict[str, MqttSession]

    def authenticate(
        self, packet: Connect, peer_host: str, then: Callable[[Login], None], offload: Offload
    ) -> bool:
        raise NotImplementedError

    def certificate_login(self, identity: str | None, client_id: str) -> Login:
        raise NotImplementedError

    def open_session(
        self, client_id: str, clean: bool, v5: bool = False
    ) -> tuple[MqttSession, bool]:
        raise NotImplementedError

    def open_sessionless(self, client_id: str, conn: MqttConnection) -> None:
        raise NotImplementedError

    def late_session(self, client_id: str, conn: MqttConnection) -> MqttSession:
        raise NotImplementedError

    def close_sessionless(self, client_id: str, conn: MqttConnection) -> None:
        raise NotImplementedError

    def expire_later(self, session: MqttSession) -> None:
        raise NotImplementedError

    def end_session(self, session: MqttSession) -> None:
        raise NotImplementedError

    def save_session(self, session: MqttSession) -> None:
        raise NotImplementedError

    def subscribe(
        self,
        session: MqttSession,
        topic_filter: str,
        qos: int,
        options: SubOptions | None = None,
        sub_id: int = 0,
    ) -> int:
        raise NotImplementedError

    def unsubscribe(self, session: MqttSession, topic_filter: str) -> None:
        raise NotImplementedError

    def send_retained(self, session: MqttSession, topic_filter: str, granted: int) -> bool:
        raise NotImplementedError

    def publish_denied(self, topic: str) -> bool:
        raise NotImplementedError

    def address_of(self, topic: str) -> str:
        raise NotImplementedError

    def route(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool = False,
        origin: MqttSession | None = None,
        *,
        pause: bool = True,
        props: Properties | None = None,
    ) -> bool:
        raise NotImplementedError

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        raise NotImplementedError


class PublisherPause:
    """A publisher's wait for the subscribers its last publish backed up (``_hold``): who
    they are, how many have not drained yet, and the timer that bounds the wait. One per
    wait, so that a drained call of an earlier one is told by identity."""

    __slots__ = ("sessions", "timer", "waiting")

    def __init__(self, sessions: list[MqttSession]) -> None:
        self.sessions = sessions
        self.waiting = len(sessions)
        self.timer: Timer | None = None


#: keep-alive values as shared objects: clients of one fleet send the same few, and an int
#: over 256 is otherwise an object of its own per connection (bounded: a client cannot make
#: the table grow without end)
_KEEP_ALIVES: dict[int, int] = {}
_KEEP_ALIVES_MAX = 1024


def shared_keep_alive(value: int) -> int:
    shared = _KEEP_ALIVES.get(value)
    if shared is not None:
        return shared
    if len(_KEEP_ALIVES) < _KEEP_ALIVES_MAX:
        _KEEP_ALIVES[value] = value
    return value


class MqttConnection:
    """Implements the transport's ``Session`` for one MQTT client."""

    # (slotted: an idle connection costs only what it holds)
    __slots__ = (
        "_acked_any",
        "_authenticating",
        "_client_id",
        "_durable",
        "_held",
        "_held_error",
        "_pause",
        "_published",
        "_refusals",
        "_state",
        "_table",
        "access",
        "keep_alive",
        "last_rx",
        "link",
        "parser",
        "server",
        "session",
        "stall",
        "will",
    )

    def __init__(self, link: Link, server: Server) -> None:
        self.link = link
        self.server = server
        self.parser = MqttParser(server.cfg.max_packet_size)
        self.parser.defer_from = BIG_FROM  # (its payload joined off the loop: _join_off_loop)
        self.parser.fill_from = FILL_FROM  # (the rest read straight into it: link.read_into)
        self._state = State.AWAIT_CONNECT
        self._table = TRANSITIONS[State.AWAIT_CONNECT]
        # (None for a clean 3.1.1 session until it is needed: ``_session_now``)
        self.session: MqttSession | None = None
        self._client_id = ""  # (set by an accepted CONNECT)
        self.will: Connect | None = None
        #: what the client's user may do (set by CONNECT)
        self.access = BEFORE_LOGIN
        # (an int as the client sent it: the small ones are shared objects, a float is not;
        # and the compiled build keeps an int attribute unboxed)
        self.keep_alive: int = 0
        # (also the CONNECT deadline's start: before CONNECT the only read is of the CONNECT
        # itself, and one cut in pieces is the stall clock's)
        self.last_rx = link.time()
        # An incomplete packet without progress (stall.py): made when a read leaves one
        # incomplete, dropped again when none is (nothing per idle connection).
        self.stall: StallClock | None = None
        self._acked_any = False
        # Packets not yet handled while a subscriber drains (see _process).
        self._held: tuple[list[Packet], int] | None = None
        self._held_error: MqttProtocolError | None = None
        self._published = False  # this read published something (memory alarm)
        # While a publish waits for slow subscribers (made per wait: see _hold).
        self._pause: PublisherPause | None = None
        # A CONNECT's password hash is being verified off the loop (reading paused).
        self._authenticating = False
        self._refusals = 0  # publishes refused for want of write permission
        # Acknowledgements that wait for the journal, keyed by its flush epoch.
        self._durable: DurableReplies[bytes] | None = None

    # The server's, read as before (two attributes fewer per connection).

    @property
    def manager(self) -> QueueManager:
        return self.server.manager

    @property
    def _stats(self) -> ProtocolStats:
        return self.server.stats

    @property
    def log(self) -> FilteringBoundLogger:
        """The link's logger, with the client id and user once CONNECT is accepted: made on
        each use and bound only when a line is logged, so that an idle connection keeps no
        logger of its own."""
        if self.access is BEFORE_LOGIN:
            return self.link.log
        return bind_lazily(self.link.log, self)

    # -- the state table -----------------------------------------------------------------------

    @property
    def state(self) -> State:
        return self._state

    def _fire(self, event: Input) -> None:
        """Move to the state the table gives for ``event`` in the current one."""
        self._state = TRANSITIONS[self._state][event]
        # The hot path reads the current row directly (no Enum hashing per packet).
        self._table = TRANSITIONS[self._state]

    @property
    def closed(self) -> bool:
        return self._state is State.CLOSED

    # -- input (Session) -----------------------------------------------------------------------

    def _buffered(self) -> int:
        """Bytes read but not yet part of a packet (the 5.0 connection's parser is its own)."""
        return self.parser.buffered

    def data_received(self, data: bytes) -> None:
        if self._state is State.CLOSED:
            return
        self.last_rx = self.link.time()
        error: MqttProtocolError | None = None
        try:
            packets = self.parser.feed(data)
        except MqttProtocolError as exc:
            packets = list(exc.packets)
            error = exc
        unjoined = self.parser.unjoined
        if unjoined is not None:
            self.parser.unjoined = None
            if self._join_off_loop(unjoined, packets, error):
                return
        fill = self.parser.filling
        if fill is not None:
            self.link.read_into(fill)
        if self._authenticating and self._held is not None:
            # (reading is paused for the login; these were on their way already)
            held, rest = self._held
            self._held = (held + packets, rest)
            self._held_error = self._held_error or error
            return
        if self._process(packets, 0):
            self._after_read(bool(packets), error)
        else:
            self._held_error = error

    def _join_off_loop(
        self, unjoined: Unjoined, packets: list[Packet], error: MqttProtocolError | None
    ) -> bool:
        """A large PUBLISH (the first of ``packets``) whose payload the parser left unjoined:
        joined in a worker thread with the GIL released (64 MiB: ~50 ms the other connections
        would wait), the packets held in order meanwhile, as for a login (reading paused).
        False when it was joined here: packets already wait (a login, a congested hold)."""
        if self._authenticating or self._held is not None:
            unjoined.fill()  # (rare: then the order is simplest kept by joining now)
            return False
        self._authenticating = True
        self._held = (packets, 0)
        self._held_error = error
        self.link.pause_reading()

        def joined(payload: bytes) -> None:
            unjoined.packet.payload = payload
            self._authenticating = False
            self._resume_held()

        self.link.offload(unjoined.join, joined)
        return True

    def _process(self, packets: list[Packet], start: int) -> bool:
        """Handle ``packets[start:]``. False when a publish found a subscriber's socket
        backed up: the rest waits (reading paused) until that subscriber has drained."""
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
            # The two packets of every QoS 1 message straight to their handlers (a native
            # call in the compiled build); the table's entry is a generic call of the same.
            if kind is Publish:
                self.on_publish(cast(Publish, packet))
            elif kind is Puback:
                self.on_puback(cast(Puback, packet))
            else:
                _HANDLERS[kind](self, packet)
            if self._authenticating:
                self._held = (packets, index + 1)
                return False
            if server.congested:
                self._hold(packets, index + 1)
                return False
        return True

    def _after_read(self, progressed: bool, error: MqttProtocolError | None) -> None:
        if self._acked_any:
            self._acked_any = False
            if self.session is not None:
                self.session.refill()
        if error is not None and self._state in RUNNING:
            self._malformed(error)
            return
        buffered = self._buffered()
        stall = self.stall
        if not buffered:
            self.stall = None
        else:
            if stall is None:
                stall = self.stall = StallClock()
            stall.after_read(buffered, progressed, self.last_rx)
        # Over the memory high watermark only connections that publish stop being read: a
        # subscriber's PUBACKs are what frees memory, so pausing it would never end.
        published, self._published = self._published, False
        link = self.link
        if self.manager.memory_blocked and not link.reading_paused and published:
            self.log.info("publisher paused: memory high watermark")
            link.pause_reading()
            self.manager.wait_for_memory(link.resume_reading)

    # -- a publisher waiting for slow subscribers ----------------------------------------------

    def _hold(self, packets: list[Packet], rest: int) -> None:
        sessions, self.server.congested = self.server.congested, []
        self._held = (packets, rest)
        pause = self._pause = PublisherPause(sessions)
        self.link.pause_reading()
        # Bounded: publishers and subscribers that wait on each other must not deadlock;
        # after this, messages beyond a session's bound are dropped as configured.
        pause.timer = self.server.call_later(
            self.server.cfg.max_publisher_pause_s, self._hold_expired
        )
        for session in sessions:
            session.when_drained(lambda: self._drained(pause))

    def _drained(self, pause: PublisherPause) -> None:
        if pause is not self._pause or self._held is None:
            return  # a hold that already ended (timed out)
        pause.waiting -= 1
        if pause.waiting > 0:
            return
        # Called from inside a session's flush: carry on in a loop callback of our own.
        self.link.call_soon(self._resume_held)

    def _hold_expired(self) -> None:
        pause = self._pause
        if pause is None:
            return
        pause.timer = None
        for session in pause.sessions:
            if session.congested and not session.stalled:
                session.stalled = True
                self.log.info(
                    "subscriber not keeping up; publishers go on", client=session.client_id
                )
        self._resume_held()

    def _resume_held(self) -> None:
        pause, self._pause = self._pause, None
        if pause is not None and pause.timer is not None:
            pause.timer.cancel()
            pause.timer = None
        held, self._held = self._held, None
        if held is None or self._state is State.CLOSED:
            return
        packets, rest = held
        if self._process(packets, rest):
            error, self._held_error = self._held_error, None
            self._after_read(True, error)
            if not self.manager.memory_blocked:
                self.link.resume_reading()
            else:  # still paused (by the hold): go on once memory is free
                self.manager.wait_for_memory(self.link.resume_reading)

    # -- the rest of Session -------------------------------------------------------------------

    def writable_again(self) -> None:
        session = self.session
        if session is not None and session.link is self.link:
            session.on_writable()

    def connection_lost(self, exc: Exception | None) -> None:
        abnormal = self._state is not State.CLOSED
        self._fire(Event.LOST)
        self._end(publish_will=abnormal)

    def shutdown(self, reason: str) -> None:
        """Broker shutdown: MQTT 3.1.1 has no server DISCONNECT, so just close (no will)."""
        self._fire(Event.SHUTDOWN)
        session, self.session = self.session, None
        self.will = None
        if session is not None and session.link is self.link:
            if session.clean:
                self.server.end_session(session)
            else:
                session.detach()
        elif session is None:
            self.server.close_sessionless(self._client_id, self)
        self.link.close()

    def close_by_operator(self, reason: str) -> None:
        """MQTT 3.1.1 has no server DISCONNECT: the socket closes. As Mosquitto's
        administrative kick (its dynamic-security plugin kicks with ``with_will`` false), the
        will is not published; a persistent session stays for the client's return."""
        self.log.info("connection closed by operator", reason=reason)
        self.shutdown(reason)

    def describe(self) -> SessionInfo:
        session = self.session
        consumers: tuple[ConsumerInfo, ...] = ()
        if session is not None and session.sub is not None:
            sub = session.sub
            consumers = (ConsumerInfo(sub.queue.name, session.client_id, sub.prefetch, sub.n_held),)
        details: dict[str, str | int | float | bool | None] = {"keep_alive_s": self.keep_alive}
        if session is not None:
            details["clean_session"] = session.clean
            details["inflight"] = len(session.outbound)
        elif self._client_id:  # a clean session not made yet
            details["clean_session"] = True
            details["inflight"] = 0
        client_id = session.client_id if session is not None else self._client_id or None
        return SessionInfo(
            "mqtt",
            self.access.user if client_id is not None else None,
            client_id,
            self._state.value,
            consumers=consumers,
            subscriptions=dict(session.filters) if session is not None else {},
            details=details,
        )

    def check_timers(self, now: float, keepalive: float, frame_timeout: float) -> None:
        """Keep-alive (1.5 x the client's), the CONNECT deadline and stalled packets."""
        if self._state is State.CLOSED:
            return
        if self.link.reading_paused:
            self.last_rx = now
            return
        if self._state is State.AWAIT_CONNECT:
            if now - self.last_rx > self.server.cfg.connect_timeout_s:
                self.log.info("no CONNECT in time")
                self._drop("connect_timeout")
            return
        stall = self.stall
        if stall is not None and stall.stalled(now, frame_timeout):
            self.log.warning("incomplete packet timed out", buffered=self._buffered())
            self._drop("packet_timeout")
        elif self.keep_alive and now - self.last_rx > self.keep_alive * 1.5:
            self.log.info("keep-alive timeout", idle_s=round(now - self.last_rx, 1))
            self._drop("keepalive_timeout")

    # -- closing -------------------------------------------------------------------------------

    def _drop(self, reason: str) -> None:
        """Close because of the client (violation, silence, takeover): the will goes out."""
        if self._state is State.CLOSED:
            return
        self._fire(Event.DROPPED)
        self._end(publish_will=True)
        self.log.info("connection dropped", reason=reason)
        self.link.close()

    def _violation(self, reason: str) -> None:
        self.server.stats.error("protocol_violation")
        self.log.warning("protocol violation", reason=reason)
        self._drop("protocol_violation")

    def _malformed(self, exc: MqttProtocolError) -> None:
        self.server.stats.error(exc.code.value)
        self.log.warning("malformed packet", code=exc.code.value, error=exc.message)
        connack = exc.code.connack_code
        if connack is not None and self._state is State.AWAIT_CONNECT:
            self.link.send(encode(Connack(connack)))
        self._drop("malformed_packet")

    def _end(self, publish_will: bool) -> None:
        """Leave the session (kept or forgotten) and publish the will if it is due."""
        session, self.session = self.session, None
        will, self.will = self.will, None
        if session is not None and session.link is self.link:
            if session.clean:
                self.server.end_session(session)
            else:
                session.detach()
        elif session is None and self._client_id:
            self.server.close_sessionless(self._client_id, self)
        if publish_will and will is not None and will.will_topic is not None:
            if self.server.publish_denied(will.will_topic) or not self.access.allowed(
                WRITE, topic_to_address(will.will_topic)
            ):
                # deny_publish and permissions cover wills too, or a will would be a way
                # around them.
                self.log.debug("will denied", topic=will.will_topic)
                return
            self.log.debug("publishing will", topic=will.will_topic)
            self.server.route(
                will.will_topic, will.will_payload, will.will_qos, will.will_retain, pause=False
            )

    def log_extra(self) -> dict[str, object]:
        """What this connection's log lines add once it is connected (``bind_lazily``)."""
        session = self.session
        return {
            "client_id": session.client_id if session is not None else self._client_id or None,
            "user": self.access.user,
        }

    def taken_over(self) -> None:
        """Another connection CONNECTed with our client id: it gets the session."""
        self.log.info("session taken over by a new connection")
        self._drop("session_taken_over")

    # -- packet handlers -----------------------------------------------------------------------

    def on_connect(self, packet: Connect) -> None:
        if self.server.use_identity_as_username and self.link.over_tls:
            packet = dataclasses.replace(packet, username=self.link.peer_identity, password=None)
        self._login(packet, lambda login: self._accept_or_refuse(packet, login))

    def _login(self, credentials: Connect, decide: Callable[[Login], None]) -> None:
        """The login of a CONNECT (3.1.1 or 5.0: ``credentials`` in 3.1.1 form), then
        ``decide(login)``: at once, or once the password's hash is verified off the loop
        (reading paused meanwhile; the packets that came after the CONNECT, held in
        ``_held``, are handled after the decision)."""
        server = self.server

        def verdict(login: Login) -> None:
            resumed, self._authenticating = self._authenticating, False
            decide(login)
            if resumed and self._state is State.CONNECTED:
                self.link.resume_reading()
                self._resume_held()

        if server.use_identity_as_username and self.link.over_tls:
            # Mosquitto's use_identity_as_username: the verified certificate is the login;
            # without one the client is not authorized whatever it sends.
            verdict(server.certificate_login(self.link.peer_identity, credentials.client_id))
        elif not server.authenticate(credentials, self.link.peer_host, verdict, self.link.offload):
            self._authenticating = True
            self.link.pause_reading()

    def _accept_or_refuse(self, packet: Connect, login: Login) -> None:
        server = self.server
        code, delay, access = login
        client_id = packet.client_id
        if code is ConnackCode.ACCEPTED and len(client_id) > server.cfg.max_client_id_length:
            code = ConnackCode.IDENTIFIER_REJECTED
        if code is not ConnackCode.ACCEPTED:
            self.log.warning("connect refused", code=code.name, client_id=client_id)
            self._fire(Event.REFUSED)
            refusal = encode(Connack(code))
            if delay <= 0:
                self.link.send(refusal)
                self.link.close()
                return
            # A failed login's CONNACK is held back (guessing slowed per address).
            self.link.pause_reading()

            def refuse() -> None:
                self.link.send(refusal)
                self.link.close()

            server.call_later(delay, refuse)
            return
        if not client_id:
            client_id = f"auto-{uuid.uuid4().hex}"
        old = server.sessions.get(client_id)
        if old is not None:
            old.take_over()
        assert access is not None
        self.access = access
        self._client_id = client_id
        session: MqttSession | None = None
        resumed = False
        if packet.clean_session:
            # Made when first needed (_session_now): an idle client holds no session
            # (docs/performance.md, "Idle connections").
            server.open_sessionless(client_id, self)
        else:
            session, resumed = server.open_session(client_id, False)
            self.session = session
            if resumed:
                self._recheck_filters(session, access)
        self.will = packet if packet.has_will else None
        self.keep_alive = shared_keep_alive(packet.keep_alive)
        self._fire(Event.ACCEPTED)
        present = resumed and packet.protocol_level == PROTOCOL_LEVEL_V311
        self.link.send(encode(Connack(ConnackCode.ACCEPTED, present)))
        if session is not None:
            self._attach(session)
        self.log.debug("connected", clean=packet.clean_session, resumed=resumed)

    def _attach(self, session: MqttSession) -> None:
        session.user = self.access.user
        session.attach(self.link, self)
        session.start_delivery()

    def _session_now(self) -> MqttSession:
        """The connection's session; a clean 3.1.1 session is made here, at the first packet
        that needs one (SUBSCRIBE, UNSUBSCRIBE, a QoS 2 PUBLISH), not at CONNECT."""
        session = self.session
        if session is None:
            session = self.session = self.server.late_session(self._client_id, self)
            self._attach(session)
        return session

    def _recheck_filters(self, session: MqttSession, access: Access) -> None:
        """A resumed session's filters were granted to whoever subscribed, maybe before a
        restart or a change of permissions: those its user may no longer read are dropped
        (as a SUBACK 0x80 would have refused them)."""
        if access.everything:
            return
        revoked = [f for f in session.filters if not access.allowed(READ, topic_to_address(f))]
        for topic_filter in revoked:
            self.server.unsubscribe(session, topic_filter)
        if revoked:
            self.server.save_session(session)
            self.log.warning("subscriptions dropped: no read permission", filters=revoked)

    def on_publish(self, packet: Publish) -> None:
        self._published = True
        self._stats.messages_received += 1
        qos = packet.qos
        pid = packet.packet_id or 0
        # (None: a clean session not made yet, which nothing of QoS 0 or 1 needs)
        session = self.session
        if qos == 2:
            session = self._session_now()
            if pid in session.inbound_qos2:
                self._acknowledge(b"\x50\x02" + pid.to_bytes(2, "big"), durable=False)
                return  # a resent QoS 2 PUBLISH: routed already, exactly once
        if self.server.publish_denied(packet.topic):
            self.log.debug("publish denied", topic=packet.topic)
            durable = False
        elif not (access := self.access).everything and not access.allowed(
            WRITE, self.server.address_of(packet.topic)
        ):
            # 3.1.1 has no negative acknowledgement: acknowledged, dropped, logged (the
            # first few of a connection at info; a client that loops must not flood the log).
            self._refusals += 1
            log = self.log.info if self._refusals <= _LOUD_REFUSALS else self.log.debug
            log("publish refused: no write permission", topic=packet.topic, count=self._refusals)
            durable = False
        else:
            durable = self.server.route(packet.topic, packet.payload, qos, packet.retain, session)
        if qos == 1:
            # (PUBACK's four bytes from one int: no concatenation)
            self._acknowledge((0x4002_0000 | pid).to_bytes(4, "big"), durable)
        elif qos == 2 and session is not None:
            session.remember_inbound_qos2(pid)
            self._acknowledge(b"\x50\x02" + pid.to_bytes(2, "big"), durable)

    def _acknowledge(self, packet: bytes, durable: bool) -> None:
        """PUBACK / PUBREC / PUBCOMP now, or once the journal has what the publish stored;
        either way in the order the publishes came (3.1.1 section 4.6)."""
        if durable:  # (the persistence looked up only then: the server's is a generic call)
            persistence = self.manager.persistence
            if persistence is not None:
                if self._durable is None:
                    self._durable = DurableReplies(persistence, self._durable_done)
                self._durable.add(packet)
                return
        if self._durable is None or not self._durable.follow(packet):
            self.link.send(packet)

    def _durable_done(self, batch: list[bytes], err: Exception | None) -> None:
        if self._state is State.CLOSED:
            return
        if err is not None:
            # MQTT 3.1.1 cannot say "not stored": withholding the acknowledgement and
            # closing makes the client send the message again.
            self.log.error("journal write failed; closing so the client resends", error=str(err))
            self._drop("storage_failure")
            return
        self.link.send(b"".join(batch))

    # (No session yet: nothing was sent to the client, nothing it acknowledges is ours.)

    def on_puback(self, packet: Puback) -> None:
        session = self.session
        if session is not None and session.puback(packet.packet_id):
            self._acked_any = True

    def on_pubrec(self, packet: Pubrec) -> None:
        if self.session is not None:
            self.session.pubrec(packet.packet_id)
            self._acked_any = True
        self.link.send(b"\x62\x02" + packet.packet_id.to_bytes(2, "big"))

    def on_pubrel(self, packet: Pubrel) -> None:
        if self.session is not None:
            self.session.inbound_qos2.discard(packet.packet_id)
        self._acknowledge(b"\x70\x02" + packet.packet_id.to_bytes(2, "big"), durable=False)

    def on_pubcomp(self, packet: Pubcomp) -> None:
        if self.session is not None:
            self.session.pubcomp(packet.packet_id)
            self._acked_any = True  # a packet id came free: the window may take the next one

    def on_subscribe(self, packet: Subscribe) -> None:
        session = self._session_now()
        server = self.server
        access = self.access
        codes = tuple(
            server.subscribe(session, f, q)
            if access.allowed(READ, topic_to_address(f))
            else _REFUSED
            for f, q in packet.subscriptions
        )
        server.save_session(session)
        self.link.send(encode(Suback(packet.packet_id, codes)))
        for (topic_filter, _), granted in zip(packet.subscriptions, codes, strict=True):
            if granted != 0x80:
                server.send_retained(session, topic_filter, granted)
            else:
                self.log.info("subscription refused", filter=topic_filter)

    def on_unsubscribe(self, packet: Unsubscribe) -> None:
        session = self._session_now()
        for topic_filter in packet.topic_filters:
            self.server.unsubscribe(session, topic_filter)
        self.server.save_session(session)
        self.link.send(encode(Unsuback(packet.packet_id)))

    def on_pingreq(self, packet: Pingreq) -> None:
        self.link.send(_PINGRESP)

    def on_disconnect(self, packet: Disconnect) -> None:
        # (The table has moved us to CLOSED already: no will.)
        self._end(publish_will=False)
        self.link.close()


#: The handler of each packet a client may send; which state accepts which is in TRANSITIONS.
_HANDLERS: dict[type, Callable[[MqttConnection, Packet], None]] = {
    Connect: MqttConnection.on_connect,  # type: ignore[dict-item]
    Publish: MqttConnection.on_publish,  # type: ignore[dict-item]
    Puback: MqttConnection.on_puback,  # type: ignore[dict-item]
    Pubrec: MqttConnection.on_pubrec,  # type: ignore[dict-item]
    Pubrel: MqttConnection.on_pubrel,  # type: ignore[dict-item]
    Pubcomp: MqttConnection.on_pubcomp,  # type: ignore[dict-item]
    Subscribe: MqttConnection.on_subscribe,  # type: ignore[dict-item]
    Unsubscribe: MqttConnection.on_unsubscribe,  # type: ignore[dict-item]
    Pingreq: MqttConnection.on_pingreq,  # type: ignore[dict-item]
    Disconnect: MqttConnection.on_disconnect,  # type: ignore[dict-item]
}
