"""The MQTT side of one broker: listener, session registry, routing, retained messages, auth.

The listener is the shared ``StreamTransport`` (socket, write batching, flow control, the
connection limit) carrying each client's sans-IO ``MqttConnection`` (connection.py); this
module is what those connections use of the broker (connection.Server).

Routing (docs/mqtt.md): a PUBLISH on topic ``a/b/c`` is the address ``a.b.c``, handed to the
core once (``QueueManager.route``): it reaches the VibeMQ queue of that name when one exists,
and every protocol's subscribers of the address. This server is the MQTT sink among them
(``deliver``): every MQTT session with a matching filter gets it, at min(publish QoS, granted
QoS), once per session however many of its filters match; a publish from another protocol
(a VibeMQ Publish, AMQP, ZeroMQ) counts as QoS 1.

Durable state lives in the journal through two core tables: ``$mqtt.retained`` (topic ->
retained message) and ``$mqtt.sessions`` (client id -> filters of a clean-session-0 client);
the messages waiting for such a client are in its own durable queue (see session.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import ssl
from collections.abc import Callable

import structlog

from vibemq_server.adapters.mqtt.codec import encode_publish
from vibemq_server.adapters.mqtt.connection import Login, MqttConnection
from vibemq_server.adapters.mqtt.packets import ConnackCode, Connect
from vibemq_server.adapters.mqtt.session import MqttSession, session_queue_name
from vibemq_server.adapters.mqtt.sys_topics import SYS_PREFIX, SysTopics
from vibemq_server.adapters.mqtt.topics import (
    address_to_topic,
    filter_to_pattern,
    matches,
    topic_filter_error,
    topic_to_address,
)
from vibemq_server.auth.authenticator import Offload, Outcome, Verdict
from vibemq_server.config import DeliveryMode, OverflowStrategy
from vibemq_server.core import CoreError, QueueOptions, StoredMessage
from vibemq_server.core.drops import DropLog
from vibemq_server.core.routing import AddressSink, MessageSource
from vibemq_server.core.table import DurableTable
from vibemq_server.core.topics import TopicRouter, pattern_overlaps
from vibemq_server.protocol.payload import PAYLOAD_ENCODING, from_core, to_core
from vibemq_server.server.adapter import AdapterContext
from vibemq_server.server.listeners import Listeners
from vibemq_server.server.transport import Link, Session, StreamTransport
from vibemq_server.server.websocket import Endpoint, WebSocketSession

log = structlog.get_logger("vibemq.mqtt")

_CONNACK = {
    Outcome.ACCEPTED: ConnackCode.ACCEPTED,
    Outcome.ANONYMOUS: ConnackCode.ACCEPTED,
    Outcome.CREDENTIALS_REQUIRED: ConnackCode.NOT_AUTHORIZED,
    Outcome.BAD_CREDENTIALS: ConnackCode.BAD_USERNAME_OR_PASSWORD,
}

RETAINED_TABLE = "$mqtt.retained"
SESSIONS_TABLE = "$mqtt.sessions"
_NEVER = 2**62

#: Headers a message published over MQTT carries into VibeMQ queues.
HEADER_TOPIC = "mqttTopic"
HEADER_QOS = "mqttQos"

#: MQTT over WebSockets: the path, and the subprotocols (3.1.1 and 5.0 name it "mqtt";
#: some 3.1 clients offer "mqttv3.1")
WS_PATH = "/mqtt"
WS_SUBPROTOCOLS = ("mqtt", "mqttv3.1")

#: A VibeMQ Publish counts as QoS 1 for MQTT subscribers: it was acknowledged to its sender.
NATIVE_QOS = 1


class MqttServer:
    def __init__(self, context: AdapterContext) -> None:
        """``context.register``/``unregister``: the broker's connection registry."""
        config = context.config
        self.register = context.register
        self.unregister = context.unregister
        self.config = config
        self.cfg = config.mqtt
        self.auth = context.auth
        self.use_identity_as_username = config.tls.use_identity_as_username
        self.manager = context.manager
        self.router: TopicRouter[MqttSession] = TopicRouter()
        self.sessions: dict[str, MqttSession] = {}
        self._ids = itertools.count(1)
        self._id_prefix = f"mqtt-{os.urandom(4).hex()}-"
        self._deny_subscribe = [filter_to_pattern(f) for f in self.cfg.deny_subscribe]
        self._deny_publish = list(self.cfg.deny_publish)
        self._addresses: dict[str, str] = {}
        # The publish being routed by route(), in its MQTT form, for deliver() to take when
        # the core hands it back (no round trip through the core form): topic, payload,
        # QoS, the publisher's session, whether congestion pauses it, its address.
        self._own: tuple[str, bytes, int, MqttSession | None, bool, str] | None = None
        # Its core form, built only when something beyond MQTT sessions takes it.
        self._own_msg: StoredMessage | None = None
        self._own_message: MessageSource = self._core_message
        self.retained: DurableTable | None = None
        self.session_table: DurableTable | None = None
        self.listeners = Listeners(context.tls)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conn_ids = itertools.count(1)
        self.port = 0
        #: output given during a read is written when the read is done (shared by protocols)
        self.batch = context.read_batch
        #: sessions whose QoS 0 backlog grew during the last route(): the publisher pauses
        self.congested: list[MqttSession] = []
        #: the MQTT counters (bytes, connections, messages, errors) and the broker's
        self.broker_stats = context.stats
        self.stats = context.stats.protocol("mqtt")
        #: drops beyond a clean session's bounds, told in the log by client id (rate-limited)
        self.drop_log = DropLog(self.manager.clock, "client_id")
        #: the $SYS/broker/... topics, published every ``sys_interval_s``
        self.sys = SysTopics(self)

    # -- start / stop ----------------------------------------------------------------------------

    def restore(self) -> None:
        """After journal recovery: the retained messages and the persistent sessions."""
        self.retained = DurableTable(self.manager, RETAINED_TABLE)
        self.session_table = DurableTable(self.manager, SESSIONS_TABLE)
        for client_id, entry in self.session_table.items():
            try:
                filters = json.loads(entry.payload)["filters"]
            except (ValueError, KeyError, TypeError):
                log.warning("unreadable session record dropped", client_id=client_id)
                self.session_table.delete(client_id)
                continue
            session = self._new_session(client_id, clean=False)
            for topic_filter, qos in filters.items():
                session.filters[topic_filter] = int(qos)
                self.router.add(session, filter_to_pattern(topic_filter), int(qos))
        # A clean session's queue cannot outlive a restart (it is not durable), but be sure.
        for name in [n for n in self.manager.queues if n.startswith("$mqtt.s.")]:
            if name[len("$mqtt.s.") :] not in self.sessions:
                self.manager.delete_queue(name)
        self.manager.register_sink(self)
        if self.sessions or len(self.retained):
            log.info(
                "mqtt state restored", sessions=len(self.sessions), retained=len(self.retained)
            )

    async def start(self) -> None:
        host = self.cfg.host or self.config.host
        loop = asyncio.get_running_loop()
        self._loop = loop
        tls = self.config.tls
        await self.listeners.open(
            "mqtt", self._accept, host, self.cfg.port if tls.plain_mqtt else None
        )
        await self.listeners.open("mqtt_tls", self._accept, host, tls.mqtt_port, tls=True)
        # MQTT over WebSockets (ws and wss): off unless a port is set
        await self.listeners.open(
            "mqtt_ws", self._accept_ws, host, self.cfg.ws_port if tls.plain_mqtt else None
        )
        await self.listeners.open("mqtt_wss", self._accept_ws, host, self.cfg.wss_port, tls=True)
        self.port = self.listeners.port("mqtt")
        self.sys.start(loop, self.cfg.sys_interval_s)

    def _accept(
        self,
        tls: ssl.SSLContext | None,
        make_session: Callable[[Link], Session] | None = None,
        kind: str = "mqtt",
    ) -> StreamTransport:
        """A new socket: the shared transport, carrying an MQTT connection once the broker's
        connection limit let it in (over the limit the socket just closes: MQTT has no
        refusal before CONNECT)."""
        return StreamTransport(
            make_session or (lambda link: MqttConnection(link, self)),
            conn_id=f"{kind}_{next(self._conn_ids)}",
            log=log,
            out_limit=self.config.write_buffer_high_bytes,
            batch=self.batch,
            register=self.register,
            unregister=self.unregister,
            refusal=b"",
            tls=tls,
            handshake_timeout=self.config.tls.handshake_timeout_s,
            stats=self.stats,
        )

    def _accept_ws(self, tls: ssl.SSLContext | None) -> StreamTransport:
        """A WebSocket socket: the shared transport, the WebSocket layer (server/websocket.py:
        handshake, frames), and the same MQTT connection inside it."""
        endpoint = Endpoint(
            path=WS_PATH,
            subprotocols=WS_SUBPROTOCOLS,
            max_message=self.cfg.max_packet_size,
            handshake_timeout=self.cfg.connect_timeout_s,
            protocol="mqtt",
        )
        return self._accept(
            tls,
            lambda link: WebSocketSession(link, lambda ws: MqttConnection(ws, self), endpoint),
            "mqttws",
        )

    def call_later(self, delay: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        """A timer for a connection (the longest pause of a publisher)."""
        loop = self._loop or asyncio.get_running_loop()
        return loop.call_later(delay, callback)

    def close(self) -> None:
        self.sys.stop()
        self.listeners.close()

    def tick(self) -> None:
        # MQTT's timers are per connection (keep-alive); drops are told once a minute.
        self.drop_log.flush()

    def ready(self) -> dict[str, int | str | None]:
        return dict(self.listeners.ports)

    # -- authentication and sessions -------------------------------------------------------------

    def authenticate(
        self, packet: Connect, peer_host: str, then: Callable[[Login], None], offload: Offload
    ) -> bool:
        """``then`` gets the CONNACK code for a CONNECT's credentials, how long to hold a
        refusal, and what the client may do once accepted (``core.permissions``): before this
        returns True, or later (False) when a password hash is verified off the loop.
        No password asks for anonymous access (the user name alone is only a label, as in
        Mosquitto); a password is checked, also where anonymous clients are let in."""
        password = None if packet.password is None else packet.password.decode("utf-8", "replace")

        def verdict_to_login(verdict: Verdict) -> None:
            code = _CONNACK[verdict.outcome]
            if code is ConnackCode.NOT_AUTHORIZED and packet.username is not None:
                # Mosquitto: a user name without its password is a bad user name or password.
                code = ConnackCode.BAD_USERNAME_OR_PASSWORD
            if verdict.user is None:
                then((code, verdict.delay, None))
            else:
                then((code, 0.0, self.auth.access(verdict.user, packet.client_id)))

        return self.auth.login(
            packet.username, password, peer_host, "mqtt", verdict_to_login, offload
        )

    def certificate_login(self, identity: str | None, client_id: str) -> Login:
        """``use_identity_as_username`` over TLS: the verified certificate's identity is the
        user (its permissions apply); no certificate, not authorised."""
        if not identity:
            return ConnackCode.NOT_AUTHORIZED, 0.0, None
        return ConnackCode.ACCEPTED, 0.0, self.auth.access(identity, client_id)

    def next_msg_id(self) -> str:
        return f"{self._id_prefix}{next(self._ids)}"

    def _new_session(self, client_id: str, clean: bool) -> MqttSession:
        cfg = self.cfg
        options = QueueOptions(
            DeliveryMode.ROUND_ROBIN,
            cfg.max_queued_messages,
            0,
            False,
            "",
            2**31,
            _NEVER,  # MQTT 3.1.1 resends on reconnect only, not on a timer
            OverflowStrategy.DROP_NEWEST,
            not clean,
        )
        # Only a persistent session needs a (durable) core queue: a clean session's
        # messages live and die with it, in memory (session.py).
        queue = None
        if not clean:
            name = session_queue_name(client_id)
            queue = self.manager.queues.get(name)
            if queue is None:
                queue, _ = self.manager.create_queue(name, options)
        session = MqttSession(
            client_id,
            clean,
            queue,
            self.manager,
            self.router,
            self.next_msg_id,
            cfg.max_inflight,
            cfg.max_queued_messages,
            self.stats,
            self.drop_log,
        )
        self.sessions[client_id] = session
        return session

    def open_session(self, client_id: str, clean: bool) -> tuple[MqttSession, bool]:
        """The session for a CONNECT (after any takeover); and whether one was resumed."""
        existing = self.sessions.get(client_id)
        if existing is not None:
            if not clean and not existing.clean:
                return existing, True
            self.end_session(existing)
        session = self._new_session(client_id, clean)
        if not clean:
            self.save_session(session)
        return session, False

    def end_session(self, session: MqttSession) -> None:
        """Forget a session: its filters, its queue, its durable record."""
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
        self.router.remove_key(session)
        self.drop_log.forget(session.client_id)
        session.detach()
        if session.queue is not None and not session.queue.deleted:
            with contextlib.suppress(CoreError):
                self.manager.delete_queue(session.queue.name)
        if not session.clean and self.session_table is not None:
            self.session_table.delete(session.client_id)

    def end_session_by_operator(self, client_id: str, reason: str) -> bool:
        """The management API ends a session: its connection (if any) is closed as by
        ``close_by_operator`` (no will), then the session is forgotten with its queued
        messages and durable record. False when there is no such session."""
        session = self.sessions.get(client_id)
        if session is None:
            return False
        log.info("session ended by operator", client_id=client_id, reason=reason)
        session.close_by_operator(reason)  # a clean session ends with its connection
        if self.sessions.get(client_id) is session:
            self.end_session(session)
        return True

    def retained_messages(self, topic_filter: str | None = None) -> list[tuple[str, StoredMessage]]:
        """The retained messages (of topics matching ``topic_filter``), by topic; ValueError
        naming why for a filter that is not one."""
        if topic_filter is not None:
            error = topic_filter_error(topic_filter)
            if error is not None:
                raise ValueError(error)
        table = self.retained
        if table is None:
            return []
        found = [
            (topic, msg)
            for topic, msg in table.items()
            if topic_filter is None or matches(topic_filter, topic)
        ]
        found.sort(key=lambda item: item[0])
        return found

    def clear_retained(self, topic: str) -> bool:
        """Forget a topic's retained message, as an empty retained PUBLISH does; False when
        there was none."""
        table = self.retained
        return table is not None and table.delete(topic)

    def save_session(self, session: MqttSession) -> None:
        if session.clean or self.session_table is None:
            return
        record = json.dumps({"filters": session.filters}, separators=(",", ":")).encode()
        self.session_table.put(session.client_id, record, {})

    # -- subscriptions ---------------------------------------------------------------------------

    def subscribe(self, session: MqttSession, topic_filter: str, qos: int) -> int:
        """Add or replace a filter; the granted QoS or 0x80 when a deny rule refuses it."""
        pattern = filter_to_pattern(topic_filter)
        if any(pattern_overlaps(pattern, deny) for deny in self._deny_subscribe):
            return 0x80
        session.filters[topic_filter] = qos
        self.router.add(session, pattern, qos)
        return qos

    def unsubscribe(self, session: MqttSession, topic_filter: str) -> None:
        if session.filters.pop(topic_filter, None) is not None:
            self.router.remove(session, filter_to_pattern(topic_filter))

    def send_retained(self, session: MqttSession, topic_filter: str, granted: int) -> bool:
        """The retained messages matching a new subscription, RETAIN set; True when one of
        them went into a durable queue."""
        if topic_filter[:1] == "$":
            self.sys.send_retained(session, topic_filter)
        if self.retained is None or not len(self.retained):
            return False
        durable = False
        for topic, msg in self.retained.items():
            if not matches(topic_filter, topic):
                continue
            qos = min(int(msg.headers.get(HEADER_QOS, "0")), granted)
            if qos == 0:
                session.send_qos0(encode_publish(topic.encode(), msg.payload, 0, retain=True))
            else:
                durable |= session.enqueue(topic, msg.payload, qos, retain=True)
        return durable

    # -- routing ---------------------------------------------------------------------------------

    def address_of(self, topic: str) -> str:
        """A topic's broker address (``topic_to_address``), remembered: publishers repeat
        their topics, and each publish needs it for permissions and routing."""
        address = self._addresses.get(topic)
        if address is None:
            if len(self._addresses) > 10_000:
                self._addresses.clear()
            address = self._addresses[topic] = topic_to_address(topic)
        return address

    def publish_denied(self, topic: str) -> bool:
        if topic[:1] == "$" and topic.startswith(SYS_PREFIX):
            return True  # only the broker publishes $SYS topics (as Mosquitto)
        deny = self._deny_publish
        return bool(deny) and any(matches(f, topic) for f in deny)

    def route(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool = False,
        origin: MqttSession | None = None,
        *,
        pause: bool = True,
    ) -> bool:
        """Deliver an MQTT publish everywhere it belongs. True when some copy will be
        journaled: the publisher's PUBACK/PUBREC then waits for the journal.

        ``pause``: whether the caller pauses for the slow subscribers this leaves in
        ``congested`` (a PUBLISH being handled does; a will has no publisher to pause)."""
        durable = False
        if retain:
            durable = self._retain(topic, payload, qos)
        address = self.address_of(topic)
        # The core hands the publish to the queue of that name and to every protocol's
        # sink, ours included: deliver() (origin is self) and _core_message() find it here.
        # Never re-entered: a delivery only buffers output (a connection lost meanwhile,
        # and its will, come from the loop later), so nothing needs saving or clearing.
        self._own = (topic, payload, qos, origin, pause, address)
        self._own_msg = None
        if self.manager.route(address, self._own_message, self):
            durable = True
        return durable

    def _core_message(self) -> StoredMessage:
        """The core form of the publish route() is routing (for a queue, other protocols)."""
        msg = self._own_msg
        if msg is None:
            assert self._own is not None
            topic, payload, qos, _, _, address = self._own
            body, headers = self._core_form(topic, payload, qos)
            msg = self._own_msg = StoredMessage(self.next_msg_id(), address, body, headers, 0)
        return msg

    def deliver(self, address: str, message: MessageSource, origin: AddressSink | None) -> bool:
        """The core's hand-over of a publish at ``address`` (the MQTT sink): to every
        session with a matching filter. True when a copy went into a durable queue.

        Our own publish keeps its MQTT form and QoS, and a congested subscriber pauses its
        publisher, except the publisher's own session (it could only drain by reading the
        very acknowledgements the pause holds back) and except for a will (``pause`` False:
        no connection consumes ``congested`` right after, so an entry left there would
        pause whichever connection handles a packet next, even the slow subscriber
        itself). Another protocol's publish counts as QoS 1 and pauses nobody, likewise."""
        targets = self.router.match(address)
        if not targets:
            return False
        own = self._own
        if origin is self and own is not None:
            topic, payload, qos, publisher, pause, _ = own
        else:
            msg = message()
            topic = address_to_topic(address)
            payload = from_core(msg.payload, msg.headers)
            qos, publisher, pause = NATIVE_QOS, None, False
        # Inline rather than a helper: every MQTT publish runs this loop.
        durable = False
        qos0: bytes | None = None
        for session, granted in targets.items():
            effective = granted if granted < qos else qos
            if effective == 0:
                if qos0 is None:
                    qos0 = encode_publish(topic.encode(), payload)
                session.send_qos0(qos0)
            elif session.enqueue(topic, payload, effective):
                durable = True
            if pause and session.congested and not session.stalled and session is not publisher:
                self.congested.append(session)
        return durable

    @staticmethod
    def _core_form(topic: str, payload: bytes, qos: int) -> tuple[bytes, dict[str, str]]:
        body, encoding = to_core(payload)
        headers = {HEADER_TOPIC: topic, HEADER_QOS: str(qos)}
        if encoding is not None:
            headers[PAYLOAD_ENCODING] = encoding
        return body, headers

    def _retain(self, topic: str, payload: bytes, qos: int) -> bool:
        table = self.retained
        if table is None:
            return False
        if not payload:
            table.delete(topic)
            return self.manager.persistence is not None
        if topic not in table and len(table) >= self.cfg.max_retained:
            log.warning("retained message not stored: limit reached", limit=self.cfg.max_retained)
            return False
        table.put(topic, payload, {HEADER_QOS: str(qos)})
        return self.manager.persistence is not None
