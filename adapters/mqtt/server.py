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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final, cast

import structlog

from vibemq_server.adapters.mqtt.codec import encode_publish, encode_publish_qos0, topic_field
from vibemq_server.adapters.mqtt.codec5 import encode_publish5, property_block
from vibemq_server.adapters.mqtt.connection import Login, MqttConnection, Server
from vibemq_server.adapters.mqtt.connection5 import MqttEntry
from vibemq_server.adapters.mqtt.message5 import (
    INTERNAL,
    header_entries,
    message_entries,
    props_to_headers,
)
from vibemq_server.adapters.mqtt.packets import ConnackCode, Connect
from vibemq_server.adapters.mqtt.packets5 import Properties, SubOptions
from vibemq_server.adapters.mqtt.session import (
    MqttSession,
    SessionContext,
    SharedMember,
    own,
    session_queue_name,
)
from vibemq_server.adapters.mqtt.session5 import NEVER_EXPIRES, Mqtt5Session
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
from vibemq_server.core import CoreError, PublishOutcome, Queue, QueueOptions, StoredMessage
from vibemq_server.core.drops import DropLog
from vibemq_server.core.routing import AddressSink, MessageSource
from vibemq_server.core.table import DurableTable
from vibemq_server.core.topics import TopicRouter, pattern_overlaps
from vibemq_server.protocol.names import valid_queue_name
from vibemq_server.protocol.payload import PAYLOAD_ENCODING, from_core, to_core
from vibemq_server.server.adapter import AdapterContext
from vibemq_server.server.listeners import Listeners
from vibemq_server.server.transport import Link, Session, StreamTransport
from vibemq_server.server.websocket import Endpoint, WebSocketSession, origin_patterns

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
#: addresses whose v5 deliveries per session are kept (``_per_session``); beyond it, cleared
_PER_CACHE_MAX = 4096


class _Plan:
    """Where a publish at an address goes (``MqttServer._plan``): its shared groups, the v5
    router's match (session, filter) -> QoS, the 3.1.1 router's match session -> QoS.

    A class, not a tuple: compiled, a tuple is kept unboxed and boxed anew where it is
    compared, so it has no identity to tell ``_NO_PLAN`` by."""

    __slots__ = ("groups", "targets", "targets5")

    def __init__(
        self,
        groups: tuple[str, ...],
        targets5: Mapping[tuple[MqttSession, str], int],
        targets: Mapping[MqttSession, int],
    ) -> None:
        self.groups = groups
        self.targets5 = targets5
        self.targets = targets


#: the plan of an address no MQTT subscriber matches: one object, so that deliver() tells it
#: by identity (every native publish to a plain queue reaches this sink with no match)
_NO_PLAN: Final = _Plan((), {}, {})

#: Headers a message published over MQTT carries into VibeMQ queues.
HEADER_TOPIC = "mqttTopic"
HEADER_QOS = "mqttQos"

#: MQTT over WebSockets: the path, and the subprotocols (3.1.1 and 5.0 name it "mqtt";
#: some 3.1 clients offer "mqttv3.1")
WS_PATH = "/mqtt"
WS_SUBPROTOCOLS = ("mqtt", "mqttv3.1")

#: A VibeMQ Publish counts as QoS 1 for MQTT subscribers: it was acknowledged to its sender.
NATIVE_QOS = 1


@dataclass(frozen=True, slots=True)
class SessionlessClient:
    """A clean 3.1.1 client connected without a session yet, as the management API shows
    it: an empty clean session (it is made at the client's first SUBSCRIBE or QoS 2
    PUBLISH)."""

    client_id: str
    user: str | None
    connection_id: str | None
    clean: bool = True
    connected: bool = True
    filters: Mapping[str, int] = field(default_factory=dict)
    queue: Queue | None = None
    queued: int = 0
    inflight: int = 0
    dropped_qos0: int = 0
    dropped_queued: int = 0


class MqttServer(Server):
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
        #: MQTT 5 subscriptions, one key per (session, filter): their options differ
        self.router5: TopicRouter[tuple[MqttSession, str]] = TopicRouter()
        #: shared subscriptions: (group, filter) -> the filter's pattern
        self.shared_router: TopicRouter[tuple[str, str]] = TopicRouter()
        self._share_members: dict[tuple[str, str], set[MqttSession]] = {}
        #: topic -> its encoded name in a PUBLISH (QoS 0 deliveries, ``deliver``)
        self._topic_fields: dict[str, bytes] = {}
        #: group -> where its direct round robin goes on (``_share_direct``)
        self._share_rr: dict[str, int] = {}
        #: address -> (the v5 router's match, its deliveries per session) (``_per_session``)
        self._per_cache: dict[
            str,
            tuple[
                Mapping[tuple[MqttSession, str], int],
                dict[Mqtt5Session, tuple[int, bool, tuple[int, ...]]],
            ],
        ] = {}
        #: address -> what deliver() does there (``_plan``)
        self._plans: dict[str, _Plan] = {}
        #: persistent v5 sessions counting down their Session Expiry Interval
        self._expiring: set[Mqtt5Session] = set()
        # The v5 parts of the publish being routed (None from a 3.1.1 client).
        self._own_props: Properties | None = None
        self._own_retain = False
        self._own_expires = 0
        self.sessions = {}
        #: clean 3.1.1 clients connected without a session yet (made at their first SUBSCRIBE
        #: or QoS 2 PUBLISH: an idle client holds none), by client id
        self.sessionless: dict[str, MqttConnection] = {}
        self._ids = itertools.count(1)
        self._id_prefix = f"mqtt-{os.urandom(4).hex()}-"
        # one bound method for every session (not a new one, 64 bytes, per session)
        self._next_msg_id = self.next_msg_id
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
        self._ws_origins = origin_patterns(self.cfg.ws_allowed_origins)
        self.retained: DurableTable | None = None
        #: when the first retained message with a Message Expiry Interval expires (the
        #: manager's clock, ms; 0: none): tick() sweeps the table then, not every time
        self._retained_due = 0
        self.session_table: DurableTable | None = None
        self.listeners = Listeners(context.tls)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conn_ids = itertools.count(1)
        self.port = 0
        #: output given during a read is written when the read is done (shared by protocols)
        self.batch = context.read_batch
        #: sessions whose QoS 0 backlog grew during the last route(): the publisher pauses
        self.congested = []
        #: the MQTT counters (bytes, connections, messages, errors) and the broker's
        self.broker_stats = context.stats
        self.stats = context.stats.protocol("mqtt")
        # what the connections of a listener share (one per TLS context)
        self._contexts = context.listener_contexts(log, self.stats)
        #: drops beyond a clean session's bounds, told in the log by client id (rate-limited)
        self.drop_log = DropLog(self.manager.clock, "client_id")
        #: what the sessions share (made with the first one)
        self._session_context: SessionContext | None = None
        #: the $SYS/broker/... topics, published every ``sys_interval_s``
        self.sys = SysTopics(self)

    # -- start / stop ----------------------------------------------------------------------------

    def restore(self) -> None:
        """After journal recovery: the retained messages and the persistent sessions."""
        self.retained = DurableTable(self.manager, RETAINED_TABLE)
        self._retained_due = self.retained.drop_expired()  # expired while the broker was down
        self.session_table = DurableTable(self.manager, SESSIONS_TABLE)
        for client_id, entry in self.session_table.items():
            try:
                record = json.loads(entry.payload)
                filters = record["filters"]
                options = record.get("v5")
            except (ValueError, KeyError, TypeError, AttributeError):
                log.warning("unreadable session record dropped", client_id=client_id)
                self.session_table.delete(client_id)
                continue
            session = self._new_session(client_id, clean=False, v5=options is not None)
            if isinstance(session, Mqtt5Session) and isinstance(options, dict):
                session.expiry_s = int(record.get("expiry", 0))
                for topic_filter, (qos, nl, rap, rh, sub_id) in options.items():
                    opts = SubOptions(int(qos), bool(nl), bool(rap), int(rh))
                    self.subscribe(session, topic_filter, int(qos), opts, int(sub_id))
                self.expire_later(session)  # counted from the restart
            else:
                for topic_filter, qos in filters.items():
                    self.subscribe(session, topic_filter, int(qos))
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
            make_session or self.new_session,
            conn_id=f"{kind}_{next(self._conn_ids)}",
            context=self._contexts.get(tls),
        )

    def new_session(self, link: Link) -> MqttEntry:
        """The sans-IO session of a new connection (over TCP, TLS or a WebSocket): it
        becomes a 3.1/3.1.1 or a 5.0 connection at CONNECT."""
        return MqttEntry(link, self)

    def _accept_ws(self, tls: ssl.SSLContext | None) -> StreamTransport:
        """A WebSocket socket: the shared transport, the WebSocket layer (server/websocket.py:
        handshake, frames), and the same MQTT session inside it (3.1.1 or 5.0)."""
        endpoint = Endpoint(
            path=WS_PATH,
            subprotocols=WS_SUBPROTOCOLS,
            max_message=self.cfg.max_packet_size,
            handshake_timeout=self.cfg.connect_timeout_s,
            protocol="mqtt",
            origins=self._ws_origins,
        )
        return self._accept(
            tls,
            lambda link: WebSocketSession(link, self.new_session, endpoint, self.batch),
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
        due = self._retained_due
        if due and due <= self.manager.clock() and self.retained is not None:
            self._retained_due = self.retained.drop_expired()
        if self._expiring:
            now = self.manager.clock()
            for session in [s for s in self._expiring if (s.expires_at or now + 1) <= now]:
                self._expiring.discard(session)
                if session.link is None and self.sessions.get(session.client_id) is session:
                    log.info("session expired", client_id=session.client_id)
                    self.end_session(session)

    def expire_later(self, session: MqttSession) -> None:
        """A persistent v5 session lost its connection: it ends after its Session Expiry
        Interval unless a client takes it up again (``attach`` stops the count)."""
        if not isinstance(session, Mqtt5Session):
            return
        if session.expiry_s == NEVER_EXPIRES or session.clean:
            return
        session.expires_at = self.manager.clock() + session.expiry_s * 1000
        self._expiring.add(session)

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

    def _new_session(self, client_id: str, clean: bool, v5: bool = False) -> MqttSession:
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
        context = self._session_context
        if (
            context is None
            or context.max_backlog != cfg.max_queued_messages
            or context.pause_bytes != cfg.pause_publishers_bytes
        ):
            context = self._session_context = SessionContext(
                self.manager,
                self.router,
                self._next_msg_id,
                cfg.max_queued_messages,
                self.stats,
                self.drop_log,
                cfg.pause_publishers_bytes,
            )
        session = (Mqtt5Session if v5 else MqttSession)(
            client_id, clean, queue, context, cfg.max_inflight
        )
        self.sessions[client_id] = session
        return session

    def open_session(
        self, client_id: str, clean: bool, v5: bool = False
    ) -> tuple[MqttSession, bool]:
        """The session for a CONNECT (after any takeover); and whether one was resumed
        (only by a client of the same protocol version)."""
        self._take_over_sessionless(client_id)
        existing = self.sessions.get(client_id)
        if existing is not None:
            if not clean and not existing.clean and existing.v5 == v5:
                if isinstance(existing, Mqtt5Session):
                    self._expiring.discard(existing)
                return existing, True
            self.end_session(existing)
        session = self._new_session(client_id, clean, v5)
        if not clean:
            self.save_session(session)
        return session, False

    def open_sessionless(self, client_id: str, conn: MqttConnection) -> None:
        """A clean 3.1.1 CONNECT (after any takeover): the session it starts with is empty,
        so none is made until the connection needs one (``late_session``); the client id is
        held meanwhile, for the next CONNECT with it to take the connection over."""
        existing = self.sessions.get(client_id)
        if existing is not None:
            self.end_session(existing)  # (a persistent one: a clean CONNECT ends it)
        self._take_over_sessionless(client_id)
        self.sessionless[client_id] = conn

    def late_session(self, client_id: str, conn: MqttConnection) -> MqttSession:
        """The clean session of a connection that had none until now."""
        self.close_sessionless(client_id, conn)
        return self._new_session(client_id, clean=True)

    def close_sessionless(self, client_id: str, conn: MqttConnection) -> None:
        if self.sessionless.get(client_id) is conn:
            del self.sessionless[client_id]

    def _take_over_sessionless(self, client_id: str) -> None:
        conn = self.sessionless.pop(client_id, None)
        if conn is not None:
            conn.taken_over()

    def client_sessions(self) -> dict[str, MqttSession | SessionlessClient]:
        """Every session, and every client connected without one yet (as an empty clean
        session): what the management API lists."""
        every: dict[str, MqttSession | SessionlessClient] = dict(self.sessions)
        for client_id in self.sessionless:
            every[client_id] = self._sessionless_view(client_id)
        return every

    def client_session(self, client_id: str) -> MqttSession | SessionlessClient | None:
        """One of ``client_sessions()``, by client id."""
        session = self.sessions.get(client_id)
        if session is None and client_id in self.sessionless:
            return self._sessionless_view(client_id)
        return session

    def _sessionless_view(self, client_id: str) -> SessionlessClient:
        conn = self.sessionless[client_id]
        return SessionlessClient(client_id, conn.access.user, conn.link.conn_id)

    def end_session(self, session: MqttSession) -> None:
        """Forget a session: its filters, its queue, its durable record."""
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
        if self.router.remove_key(session):
            self._plans_changed()
        if isinstance(session, Mqtt5Session):
            self._expiring.discard(session)
        for topic_filter in list(session.shared) + list(getattr(session, "options5", ())):
            self.unsubscribe(session, topic_filter)
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
            conn = self.sessionless.get(client_id)
            if conn is None:
                return False
            log.info("session ended by operator", client_id=client_id, reason=reason)
            conn.close_by_operator(reason)  # (its clean session is nothing more)
            return True
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
        self._retained_due = table.drop_expired()
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
        data: dict[str, object] = {"filters": session.filters}
        if isinstance(session, Mqtt5Session):
            data["expiry"] = session.expiry_s
            data["v5"] = {
                f: [o.qos, o.no_local, o.retain_as_published, o.retain_handling, sub_id]
                for f, (o, sub_id) in session.options5.items()
            } | {f: [m.granted, False, False, 0, m.sub_id] for f, m in session.shared.items()}
        record = json.dumps(data, separators=(",", ":")).encode()
        self.session_table.put(session.client_id, record, {})

    # -- subscriptions ---------------------------------------------------------------------------

    def subscribe(
        self,
        session: MqttSession,
        topic_filter: str,
        qos: int,
        options: SubOptions | None = None,
        sub_id: int = 0,
    ) -> int:
        """Add or replace a filter; the granted QoS, or 0x80 when a deny rule refuses it
        (0x8F: a shared subscription whose group cannot name a queue). ``options`` and
        ``sub_id``: a v5 client's subscription options and identifier."""
        share = shared_filter(topic_filter)
        real = share[1] if share is not None else topic_filter
        pattern = filter_to_pattern(real)
        if any(pattern_overlaps(pattern, deny) for deny in self._deny_subscribe):
            return 0x80
        if share is not None:
            if not valid_queue_name(share[0]):
                return 0x8F if session.v5 else 0x80
            self._join_share(session, topic_filter, share, pattern, qos, sub_id)
        elif isinstance(session, Mqtt5Session):
            session.options5 = own(session.options5)
            session.options5[topic_filter] = (options or SubOptions(qos), sub_id)
            self.router5.add((session, topic_filter), pattern, qos)
        else:
            self.router.add(session, pattern, qos)
        session.filters = own(session.filters)
        session.filters[topic_filter] = qos
        self._plans_changed()
        return qos

    def _join_share(
        self,
        session: MqttSession,
        topic_filter: str,
        share: tuple[str, str],
        pattern: tuple[str, ...],
        qos: int,
        sub_id: int,
    ) -> None:
        """``$share/{group}/{filter}``: the session joins the group, whose messages wait in
        the RoundRobin core queue named ``group`` (created when missing)."""
        group = share[0]
        if group not in self.manager.queues:
            self.manager.create_queue(group, self._share_options())
        members = self._share_members.setdefault(share, set())
        if not members:
            self.shared_router.add(share, pattern, 0)
        members.add(session)
        member = session.shared.get(topic_filter)
        if member is None:
            session.shared = own(session.shared)
            member = session.shared[topic_filter] = SharedMember(
                session, group, topic_filter, qos, self._give_back
            )
        member.granted = qos
        member.sub_id = sub_id
        member.join()

    def _share_options(self) -> QueueOptions:
        cfg = self.cfg
        return QueueOptions(
            DeliveryMode.ROUND_ROBIN,
            cfg.max_queued_messages,
            0,
            False,
            "",
            2**31,
            _NEVER,  # a member's unacknowledged messages go to another when it leaves
            OverflowStrategy.DROP_NEWEST,
            False,
        )

    def unsubscribe(self, session: MqttSession, topic_filter: str) -> None:
        if session.filters.pop(topic_filter, None) is None:
            return
        member = session.shared.pop(topic_filter, None)
        if member is not None:
            member.leave()
            share = shared_filter(topic_filter)
            assert share is not None
            members = self._share_members.get(share)
            if members is not None:
                members.discard(session)
                if not members:
                    del self._share_members[share]
                    self.shared_router.remove(share, filter_to_pattern(share[1]))
        elif isinstance(session, Mqtt5Session):
            session.options5.pop(topic_filter, None)
            self.router5.remove((session, topic_filter), filter_to_pattern(topic_filter))
        else:
            self.router.remove(session, filter_to_pattern(topic_filter))
        self._plans_changed()

    def send_retained(self, session: MqttSession, topic_filter: str, granted: int) -> bool:
        """The retained messages matching a new subscription, RETAIN set; True when one of
        them went into a durable queue."""
        if topic_filter[:1] == "$":
            self.sys.send_retained(session, topic_filter)
        if self.retained is None or not len(self.retained):
            return False
        durable = False
        now = self.manager.clock()
        for topic, msg in self.retained.items():
            if not matches(topic_filter, topic):
                continue
            expires = msg.expires_at
            if expires and expires <= now:
                # A v5 Message Expiry Interval ran out (section 3.3.2.3.3): gone for good.
                self.retained.delete(topic)
                continue
            qos = min(int(msg.headers.get(HEADER_QOS, "0")), granted)
            if isinstance(session, Mqtt5Session):
                # with the properties it was published with, and the interval left
                entries = header_entries(msg.headers)
                if qos == 0:
                    session.send5(topic, msg.payload, True, entries, expires, ())
                else:
                    headers5 = {k: v for k, v in msg.headers.items() if k not in INTERNAL}
                    durable |= session.enqueue5(
                        topic, msg.payload, qos, True, entries, expires, (), headers5
                    )
            elif qos == 0:
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
        props: Properties | None = None,
    ) -> bool:
        """Deliver an MQTT publish everywhere it belongs (``props``: a v5 publish's). True
        when some copy will be journaled: the publisher's PUBACK/PUBREC then waits for the
        journal.

        ``pause``: whether the caller pauses for the slow subscribers this leaves in
        ``congested`` (a PUBLISH being handled does; a will has no publisher to pause)."""
        durable = False
        if retain:
            durable = self._retain(topic, payload, qos, props)
        address = self.address_of(topic)
        # The core hands the publish to the queue of that name and to every protocol's
        # sink, ours included: deliver() (origin is self) and _core_message() find it here.
        # Never re-entered: a delivery only buffers output (a connection lost meanwhile,
        # and its will, come from the loop later), so nothing needs saving or clearing.
        self._own = (topic, payload, qos, origin, pause, address)
        self._own_msg = None
        self._own_props = props
        self._own_retain = retain
        if props is not None:
            expiry = props.message_expiry_interval
            self._own_expires = 0 if expiry is None else self.manager.clock() + expiry * 1000
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
            props = self._own_props
            expires = 0
            if props is not None:
                headers.update(props_to_headers(props))
                expires = self._own_expires
            msg = self._own_msg = StoredMessage(
                self.next_msg_id(), address, body, headers, 0, expires
            )
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
        plan = self._plans.get(address)
        if plan is None:
            plan = self._plan(address)
        if plan is _NO_PLAN:
            return False
        groups = plan.groups
        targets5 = plan.targets5
        targets = plan.targets
        durable = False
        if groups and self._deliver_shared(groups, message, origin):
            durable = True
        if targets5 and self._deliver5(address, targets5, message, origin):
            durable = True
        if not targets:
            return durable
        own = self._own
        if origin is self and own is not None:
            topic, payload, qos, publisher, pause, _ = own
        else:
            msg = message()
            topic = address_to_topic(address)
            payload = from_core(msg.payload, msg.headers)
            qos, publisher, pause = NATIVE_QOS, None, False
        # Inline rather than a helper: every MQTT publish runs this loop. (A match that is
        # not empty is the router's own dict: iterated as one, natively, in the compiled
        # build; a Mapping's items() is a generic call and iteration.)
        qos0: bytes | None = None
        for session, granted in cast(dict[MqttSession, int], targets).items():
            effective = granted if granted < qos else qos
            if effective == 0:
                if qos0 is None:
                    field = self._topic_fields.get(topic)
                    if field is None:
                        if len(self._topic_fields) > 10_000:
                            self._topic_fields.clear()
                        field = self._topic_fields[topic] = topic_field(topic)
                    qos0 = encode_publish_qos0(field, payload)
                session.send_qos0(qos0)
            elif session.enqueue(topic, payload, effective):
                durable = True
            if pause and session.congested and not session.stalled and session is not publisher:
                self.congested.append(session)
        return durable

    def _plan(self, address: str) -> _Plan:
        """What deliver() does at ``address``: the shared groups it goes to, the v5 and the
        3.1.1 router's matches. One lookup a publish instead of three (each router keeps
        its matches too), kept until a subscription changes (``_plans_changed``)."""
        groups: tuple[str, ...] = ()
        if self._share_members:
            # (several filters of one group may match: the group still gets it once)
            groups = tuple(dict.fromkeys([g for g, _ in self.shared_router.match(address)]))
        targets5 = self.router5.match(address)
        targets = self.router.match(address)
        plan = _Plan(groups, targets5, targets) if groups or targets5 or targets else _NO_PLAN
        if len(self._plans) >= _PER_CACHE_MAX:
            self._plans.clear()
        self._plans[address] = plan
        return plan

    def _plans_changed(self) -> None:
        """A subscription was added or removed: every address's plan is worked out again."""
        self._plans.clear()
        self._per_cache.clear()

    def _deliver_shared(
        self, groups: tuple[str, ...], message: MessageSource, origin: AddressSink | None
    ) -> bool:
        """deliver() for shared groups: one member each, straight from our own publish
        (``_share_direct``) or through the group's queue."""
        own = self._own
        direct = origin is self and own is not None and self._own_props is None
        durable = False
        msg: StoredMessage | None = None
        now = 0
        for group in groups:
            if direct and own is not None and self._share_direct(group, own[0], own[1], own[2]):
                continue
            if msg is None:
                msg = message()
                now = self.manager.clock()
            ttl = max(1, msg.expires_at - now) if msg.expires_at else 0
            try:
                outcome = self.manager.publish(
                    group,
                    self.next_msg_id(),
                    msg.payload,
                    msg.headers,
                    route=False,
                    ttl_ms=ttl,
                )
            except CoreError as exc:
                log.warning("shared group refused a message", group=group, error=str(exc))
                continue
            if outcome is PublishOutcome.ACCEPTED_DURABLE:
                durable = True
        return durable

    def _deliver5(
        self,
        address: str,
        targets: Mapping[tuple[MqttSession, str], int],
        message: MessageSource,
        origin: AddressSink | None,
    ) -> bool:
        """deliver() for v5 subscribers."""
        durable = False
        own = self._own
        headers5: dict[str, str] | None = None
        props: Properties | None = None
        if origin is self and own is not None:
            topic, payload, qos, publisher, pause, _ = own
            props = self._own_props
            entries = message_entries(props) if props is not None else b""
            expires = self._own_expires if props is not None else 0
            retain = self._own_retain
        else:
            msg = message()
            topic = address_to_topic(address)
            payload = from_core(msg.payload, msg.headers)
            qos, publisher, pause, retain = NATIVE_QOS, None, False, False
            headers5 = {k: v for k, v in msg.headers.items() if k not in INTERNAL}
            entries = header_entries(headers5) if headers5 else b""
            expires = msg.expires_at
        if len(targets) == 1:  # (the usual case: one filter of one session)
            ((member, topic_filter), granted) = next(iter(targets.items()))
            session = cast(Mqtt5Session, member)
            options, sub_id = session.options5[topic_filter]
            if options.no_local and session is publisher:
                return durable
            effective = granted if granted < qos else qos
            flag = retain and options.retain_as_published
            if effective == 0:
                session.send5(topic, payload, flag, entries, expires, (sub_id,) if sub_id else ())
            else:
                if props is not None and session.queue is not None:
                    headers5 = props_to_headers(props)
                if session.enqueue5(
                    topic,
                    payload,
                    effective,
                    flag,
                    entries,
                    expires,
                    (sub_id,) if sub_id else (),
                    headers5,
                ):
                    durable = True
            if pause and session.congested and not session.stalled and session is not publisher:
                self.congested.append(session)
            return durable
        per = self._per_session(address, targets, publisher)
        shared_qos0: dict[bool, bytes] = {}
        for session, (granted, keep_retain, ids) in per.items():
            effective = granted if granted < qos else qos
            flag = retain and keep_retain
            if effective == 0:
                if ids or expires or session.alias_max_out:
                    session.send5(topic, payload, flag, entries, expires, ids)
                else:  # the same bytes for every such subscriber
                    packet = shared_qos0.get(flag)
                    if packet is None:
                        packet = shared_qos0[flag] = encode_publish5(
                            topic.encode(), payload, 0, 0, property_block(entries), retain=flag
                        )
                    session.send5_packet(packet)
            else:
                if props is not None and headers5 is None and session.queue is not None:
                    headers5 = props_to_headers(props)  # (only a persistent session keeps them)
                if session.enqueue5(
                    topic, payload, effective, flag, entries, expires, ids, headers5
                ):
                    durable = True
            if pause and session.congested and not session.stalled and session is not publisher:
                self.congested.append(session)
        return durable

    def _per_session(
        self,
        address: str,
        targets: Mapping[tuple[MqttSession, str], int],
        publisher: MqttSession | None,
    ) -> Mapping[Mqtt5Session, tuple[int, bool, tuple[int, ...]]]:
        """One delivery per session: the highest granted QoS of its matching filters, every
        one's subscription identifier, retain kept when one of them says Retain As
        Published; a No Local filter does not match its own client's publishes. Kept per
        address while the router's match for it is the same object (the router makes a new
        one when a subscription changes) and no filter says No Local (the publisher then
        counts): a fan-out's publishes to one topic work this out once."""
        cached = self._per_cache.get(address)
        if cached is not None and cached[0] is targets:
            return cached[1]
        per: dict[Mqtt5Session, tuple[int, bool, tuple[int, ...]]] = {}
        no_local = False
        for (member, topic_filter), granted in targets.items():
            session = cast(Mqtt5Session, member)
            options, sub_id = session.options5[topic_filter]
            if options.no_local:
                no_local = True
                if session is publisher:
                    continue
            seen = per.get(session)
            ids: tuple[int, ...] = (sub_id,) if sub_id else ()
            if seen is None:
                per[session] = (granted, options.retain_as_published, ids)
            else:
                per[session] = (
                    max(seen[0], granted),
                    seen[1] or options.retain_as_published,
                    seen[2] + ids,
                )
        if not no_local:
            if len(self._per_cache) >= _PER_CACHE_MAX:
                self._per_cache.clear()
            self._per_cache[address] = (targets, per)
        return per

    def _share_direct(self, group: str, topic: str, payload: bytes, qos: int) -> bool:
        """Our own QoS 0/1 publish (no v5 properties) for a shared group, handed straight to
        one member, round robin, when the group's queue is just MQTT members and nothing
        waits in it: what the queue would do, without the message's core form (a non-JSON
        payload base64-encoded into the queue and decoded again for the member) and the
        queue's bookkeeping. False: the queue decides (a VibeMQ or AMQP consumer shares the
        group, messages wait there, or no member has room). The member remembers a QoS 1
        message until its PUBACK and gives it back to the queue if it leaves first
        (``SharedMember.leave``), so the queue stays the truth for everything not
        acknowledged."""
        queue = self.manager.queues.get(group)
        if queue is None or queue.count or qos == 2:
            return False
        subs = queue.subscriptions
        for sub in subs:
            if not isinstance(sub.consumer, SharedMember):
                return False
        n = len(subs)
        start = self._share_rr.get(group, 0)
        for i in range(n):
            idx = start + i
            if idx >= n:
                idx -= n
            sub = subs[idx]
            member = cast(SharedMember, sub.consumer)
            session = member.session
            if sub.n_held + member.direct < sub.prefetch and session.writable:
                self._share_rr[group] = idx + 1
                session.deliver_direct(member, topic, payload, qos)
                return True
        return False

    def _give_back(self, group: str, topic: str, payload: bytes, qos: int) -> None:
        """A direct shared delivery its member left without acknowledging: into the group's
        queue, for the others (``SharedMember.leave``)."""
        body, headers = self._core_form(topic, payload, qos)
        try:
            self.manager.publish(group, self.next_msg_id(), body, headers, route=False)
        except CoreError as exc:
            log.warning("shared group refused a message given back", group=group, error=str(exc))

    @staticmethod
    def _core_form(topic: str, payload: bytes, qos: int) -> tuple[bytes, dict[str, str]]:
        # The bytes as they are (marked raw): no JSON check, no base64 (protocol/payload.py).
        body, encoding = to_core(payload)
        return body, {HEADER_TOPIC: topic, HEADER_QOS: str(qos), PAYLOAD_ENCODING: encoding}

    def _retain(
        self, topic: str, payload: bytes, qos: int, props: Properties | None = None
    ) -> bool:
        """Store (or clear) a topic's retained message, with a v5 publish's properties as
        headers (``message5``)."""
        table = self.retained
        if table is None:
            return False
        if not payload:
            table.delete(topic)
            return self.manager.persistence is not None
        limit = self.cfg.max_retained
        if topic not in table and len(table) >= limit:
            due = self._retained_due
            if due and due <= self.manager.clock():  # (no sweep per publish while full)
                self._retained_due = table.drop_expired()
        if topic not in table and len(table) >= limit:
            log.warning("retained message not stored: limit reached", limit=limit)
            return False
        headers = {HEADER_QOS: str(qos)}
        expires_at = 0
        if props is not None:
            headers.update(props_to_headers(props))
            expiry = props.message_expiry_interval
            if expiry is not None:
                expires_at = self.manager.clock() + expiry * 1000
                due = self._retained_due
                self._retained_due = expires_at if not due or expires_at < due else due
        table.put(topic, payload, headers, expires_at)
        return self.manager.persistence is not None


def shared_filter(topic_filter: str) -> tuple[str, str] | None:
    """``$share/{group}/{filter}`` -> (group, filter); None for any other filter (or a
    ``$share/`` one without a group or filter, which then is a plain filter)."""
    if not topic_filter.startswith("$share/"):
        return None
    group, _, real = topic_filter[len("$share/") :].partition("/")
    if not group or not real or "+" in group or "#" in group:
        return None
    return group, real
