"""One MQTT client session: its subscriptions, outbound queue and packet-id state machines.

A session outlives its connections when the client asked for clean session = 0. Its QoS 1
and 2 messages then wait in a durable core queue of its own (``$mqtt.s.<client id>``), so
acks, the in-flight window (the subscription's prefetch), bounds and the journal are the
core's. A clean session's messages live and die with it: they go out directly, tracked by
packet id alone (``direct``), or wait in a bounded in-memory list for the in-flight window,
without the core's per-message bookkeeping. QoS 0 messages go straight to the socket, or
wait in a bounded backlog while the socket is paused, and are not kept for an absent client
(as Mosquitto does by default).

Packet-id flows, as the server sends them (3.1.1 section 4.3):

* QoS 1: PUBLISH -> PUBACK settles the core message.
* QoS 2: PUBLISH -> PUBREC settles it and we answer PUBREL -> PUBCOMP frees the packet id.
* A message unacknowledged when the connection drops goes back to the queue front and is
  sent again on the next connection with DUP set and the same packet id; PUBRELs still owed
  are sent again first.

Inbound QoS 2 (the client publishing) is "method B": the message is routed on PUBLISH, its
packet id remembered until PUBREL, and a duplicate PUBLISH with that id is not routed again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Final, Protocol, TypeVar

from vibemq_server.adapters.mqtt.codec import LARGE_PAYLOAD, encode_publish, publish_head
from vibemq_server.adapters.mqtt.session_types import NoEntries as _NoEntries
from vibemq_server.adapters.mqtt.session_types import NoIds as _NoIds
from vibemq_server.adapters.mqtt.session_types import NoItems as _NoItems
from vibemq_server.adapters.mqtt.session_types import OperatorClose
from vibemq_server.adapters.mqtt.topics import address_to_topic
from vibemq_server.core import (
    Consumer,
    PublishOutcome,
    Queue,
    QueueManager,
    StoredMessage,
    Subscription,
)
from vibemq_server.core.drops import DropLog
from vibemq_server.core.topics import TopicRouter
from vibemq_server.protocol.payload import from_core
from vibemq_server.server.stats import ProtocolStats

#: Headers of the messages in a session queue.
TOPIC: Final = "mqttTopic"
QOS: Final = "mqttQos"
RETAIN: Final = "mqttRetain"

MAX_PACKET_ID: Final = 65_535

#: The default of ``mqtt.pause_publishers_bytes``: a subscriber with this many payload bytes
#: waiting for it in the broker's memory (not yet written: beyond its socket) is congested:
#: its publishers pause (``congested``) until it is down to half of it, as they do at half
#: ``max_queued_messages``. The count alone let a publisher of 1 MiB messages that outran its
#: subscriber keep hundreds of them here: a heap grown by a page fault every 4 KiB and each
#: payload cold again by its delivery, some 13 % of the broker's CPU a message
#: (docs/performance.md, "Fourteenth round, MQTT at 1 MiB"). Half as much to resume: a
#: publisher is not paused again a message later.
PAUSE_BYTES: Final = 8 * 1024 * 1024

_K = TypeVar("_K")
_V = TypeVar("_V")


_NO_IDS: Final[set[int]] = _NoIds()
#: no publisher waiting (shared; a session makes its own list for the first one)
_NO_WAITERS: Final[list[Any]] = []
NO_ENTRIES: Final[dict[Any, Any]] = _NoEntries()
_NO_ITEMS: Final[deque[Any]] = _NoItems()


def _ids(current: set[int]) -> set[int]:
    """``current``, or a set of its own in place of the shared empty one."""
    return set() if current is _NO_IDS else current


def own(current: dict[_K, _V]) -> dict[_K, _V]:
    """``current``, or a dict of its own in place of the shared empty one."""
    return {} if current is NO_ENTRIES else current


def _items(current: deque[Any]) -> deque[Any]:
    """``current``, or a deque of its own in place of the shared empty one."""
    return deque() if current is _NO_ITEMS else current


class Link(Protocol):
    """What a session needs of its current connection's socket (``StreamTransport`` is one):
    deliveries go straight to it."""

    @property
    def writable(self) -> bool: ...

    def send(self, data: bytes) -> None: ...

    def send_parts(self, parts: tuple[bytes, bytes]) -> None: ...


class Holder(Protocol):
    """The connection holding a session: ``taken_over`` makes it let go (a new CONNECT
    with the same client id)."""

    def taken_over(self) -> None: ...


def send_publish(
    link: Link,
    topic: bytes,
    payload: bytes,
    qos: int,
    pid: int,
    *,
    retain: bool = False,
    dup: bool = False,
) -> None:
    """Send a PUBLISH; a large payload as a buffer of its own after the header (the
    transport writes both with one writev), not copied into one packet with it."""
    if len(payload) < LARGE_PAYLOAD:
        link.send(encode_publish(topic, payload, qos, pid, retain=retain, dup=dup))
    else:
        # (one call for both: each is a generic call through the Link protocol)
        link.send_parts(
            (publish_head(topic, len(payload), qos, pid, retain=retain, dup=dup), payload)
        )


def session_queue_name(client_id: str) -> str:
    return f"$mqtt.s.{client_id}"


def shared_qos(msg: StoredMessage) -> int:
    """The QoS of a message in a shared group's queue: as published over MQTT, else 1 (a
    VibeMQ or AMQP publish was acknowledged to its sender)."""
    qos = msg.headers.get(QOS)
    return 2 if qos == "2" else 0 if qos == "0" else 1


class SharedMember(Consumer):
    """One session's membership of a shared subscription (``$share/{group}/{filter}``): a
    core consumer of the group's RoundRobin queue while the session is connected, so the
    queue's round robin balances the group (VibeMQ and AMQP consumers of that queue
    included), and what a member that leaves had unacknowledged goes to another."""

    def __init__(
        self,
        session: MqttSession,
        queue_name: str,
        share: str,
        granted: int,
        give_back: Callable[[str, str, bytes, int], None] | None = None,
    ) -> None:
        """``give_back(group, topic, payload, qos)``: puts a message this member had from
        the server's direct round robin (``MqttServer._share_direct``) and did not
        acknowledge back into the group's queue when the member leaves."""
        self.session = session
        self.queue_name = queue_name
        self.share = share
        self.granted = granted
        #: the subscription identifier the SUBSCRIBE gave (v5), 0 for none
        self.sub_id = 0
        self.sub: Subscription | None = None
        #: QoS 1 messages handed over directly (not through the queue), not yet acknowledged
        self.direct = 0
        self._give_back = give_back

    @property
    def writable(self) -> bool:
        # The queue counts its own in-flight messages against the prefetch; the direct
        # ones count too, so that the member's window holds for both.
        sub = self.sub
        return self.session.writable and (
            not self.direct or sub is None or sub.n_held + self.direct < sub.prefetch
        )

    def deliver(self, sub: Subscription, msg: StoredMessage) -> None:
        self.session.deliver_shared(sub, msg, self.granted)

    def subscription_cancelled(self, sub: Subscription, reason: str) -> None:
        self.sub = None

    def join(self) -> None:
        session = self.session
        if session.link is not None and self.sub is None:
            self.sub = session.manager.subscribe(
                self.queue_name,
                f"{session.client_id}/{self.share}",
                self,
                session.max_inflight,
                dispatch=False,
            )

    def leave(self) -> None:
        sub, self.sub = self.sub, None
        if sub is not None and not sub.queue.deleted:
            self.session.manager.unsubscribe(sub)
        if self.direct:
            # What the direct round robin gave this member and it did not acknowledge goes
            # to the group's queue, so another member gets it (as the queue's own do).
            for topic, payload, qos in self.session.take_direct(self):
                if self._give_back is not None:
                    self._give_back(self.queue_name, topic, payload, qos)

    def dispatch(self) -> None:
        if self.sub is not None:
            self.sub.queue.dispatch()


class SessionContext:
    """What the sessions of one MQTT server share (its queue manager, topic router, message
    ids, backlog bound, counters and drop log): one object they point to, instead of six
    attributes copied into every session (docs/performance.md, "Idle connections")."""

    __slots__ = (
        "drop_log",
        "manager",
        "max_backlog",
        "next_msg_id",
        "pause_bytes",
        "resume_bytes",
        "router",
        "stats",
    )

    def __init__(
        self,
        manager: QueueManager,
        router: TopicRouter[MqttSession],
        next_msg_id: Callable[[], str],
        max_backlog: int,
        stats: ProtocolStats | None = None,
        drop_log: DropLog | None = None,
        pause_bytes: int = PAUSE_BYTES,
    ) -> None:
        """``stats``: the MQTT counters (messages sent, drops); ``drop_log``: where drops
        beyond a session's in-memory bounds are told (rate-limited); ``pause_bytes``: the
        payload bytes waiting for a subscriber that pause its publishers (half resumes)."""
        self.manager = manager
        self.router = router
        self.next_msg_id = next_msg_id
        self.max_backlog = max_backlog
        self.pause_bytes = pause_bytes
        self.resume_bytes = pause_bytes // 2
        self.stats = stats if stats is not None else ProtocolStats("mqtt")
        self.drop_log = drop_log


class MqttSession(Consumer):
    """Implements the core's Consumer for its own queue."""

    #: an MQTT 5.0 session (``session5.Mqtt5Session``)
    v5 = False

    # Slotted, and its sets and deques shared empty ones until used: thousands of idle
    # sessions hold only what they must (docs/performance.md, "Idle connections").
    __slots__ = (
        "_backlog",
        "_ctx",
        "_drain_waiters",
        "_headers",
        "_next_pid",
        "_on_takeover",
        "_pending",
        "_pending_bytes",
        "_topics",
        "_used",
        "clean",
        "client_id",
        "direct",
        "dropped_qos0",
        "dropped_queued",
        "filters",
        "inbound_qos2",
        "link",
        "max_inflight",
        "outbound",
        "packet_ids",
        "pubrel",
        "queue",
        "shared",
        "shared_direct",
        "shared_out",
        "stalled",
        "sub",
        "user",
    )

    def __init__(
        self,
        client_id: str,
        clean: bool,
        queue: Queue | None,
        context: SessionContext,
        max_inflight: int,
    ) -> None:
        """``context``: what the server's sessions share."""
        self.client_id = client_id
        self._ctx = context
        self.clean = clean
        self.queue = queue
        self.max_inflight = max_inflight
        self.link: Link | None = None
        # What makes the connection holding this session give it up (a new CONNECT with
        # the same client id takes it over).
        self._on_takeover: Holder | None = None
        self.sub: Subscription | None = None
        #: topic filter -> granted QoS
        self.filters: dict[str, int] = NO_ENTRIES
        #: packet id -> message sent and awaiting PUBACK (QoS 1) or PUBREC (QoS 2)
        self.outbound: dict[int, StoredMessage] = NO_ENTRIES
        #: packet id -> QoS of a clean session's delivery sent without the core queue
        self.direct: dict[int, int] = NO_ENTRIES
        #: packet ids of QoS 2 deliveries that got PUBREC and now await PUBCOMP
        self.pubrel: set[int] = _NO_IDS
        #: packet ids of QoS 2 publishes received and awaiting the client's PUBREL
        self.inbound_qos2: set[int] = _NO_IDS
        #: message id -> packet id, for every message sent and not yet acknowledged: a
        #: redelivery after a reconnect reuses the id
        self.packet_ids: dict[str, int] = NO_ENTRIES
        self._used: set[int] = _NO_IDS
        self._next_pid = 1
        self._backlog: deque[bytes] = _NO_ITEMS
        # Publishers paused until the QoS 0 backlog has drained.
        self._drain_waiters: list[Callable[[], None]] = _NO_WAITERS
        # Made a publisher wait the longest pause without catching up: a stuck client
        # (connected, not reading or not acking) must not slow every publisher down, so it
        # pauses nobody until it has drained; meanwhile its bounds drop messages.
        self.stalled = False
        self._headers: dict[tuple[str, int, bool], dict[str, str]] = NO_ENTRIES
        self._topics: dict[str, bytes] = NO_ENTRIES
        # A clean session's QoS 1/2 messages waiting for the in-flight window.
        # (A v5 session's entries carry its properties too.)
        self._pending: deque[tuple[Any, ...]] = _NO_ITEMS
        self._pending_bytes = 0  # their payloads' (each entry's second item)
        #: shared subscriptions (``$share/{group}/{filter}``) -> their member in the group
        self.shared: dict[str, SharedMember] = NO_ENTRIES
        #: packet id -> (subscription, message) of a shared subscription's delivery
        self.shared_out: dict[int, tuple[Subscription, StoredMessage, int]] = NO_ENTRIES
        #: packet id -> (member, topic, payload, QoS) of a shared delivery the server's
        #: direct round robin made (``MqttServer._share_direct``), awaiting PUBACK
        self.shared_direct: dict[int, tuple[SharedMember, str, bytes, int]] = NO_ENTRIES
        self.dropped_qos0 = 0
        self.dropped_queued = 0
        #: who the last connection holding the session logged in as (in memory only: None
        #: for a persistent session restored at start until its client is back)
        self.user: str | None = None

    # -- what the management API shows ----------------------------------------------------------

    # What the server's sessions share (``SessionContext``), read as before.

    @property
    def manager(self) -> QueueManager:
        return self._ctx.manager

    @property
    def router(self) -> TopicRouter[MqttSession]:
        return self._ctx.router

    @property
    def max_backlog(self) -> int:
        return self._ctx.max_backlog

    @property
    def stats(self) -> ProtocolStats:
        return self._ctx.stats

    @property
    def drop_log(self) -> DropLog | None:
        return self._ctx.drop_log

    @property
    def queued(self) -> int:
        """QoS 1/2 messages waiting for the client (not yet sent)."""
        return self.queue.message_count if self.queue is not None else len(self._pending)

    @property
    def inflight(self) -> int:
        """QoS 1/2 messages sent and not acknowledged yet."""
        return len(self.outbound) + len(self.direct)

    @property
    def connection_id(self) -> str | None:
        """The id of the connection holding the session (``/api/connections``), if any."""
        conn_id = getattr(self.link, "conn_id", None)
        return conn_id if isinstance(conn_id, str) else None

    def close_by_operator(self, reason: str) -> None:
        """Close the connection holding the session (no will), if one does."""
        link = self.link
        if isinstance(link, OperatorClose):
            link.close_by_operator(reason)

    # -- connection lifecycle ------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self.link is not None

    def attach(self, link: Link, holder: Holder) -> None:
        """Bind to a new connection; PUBRELs still owed go out before anything else.
        ``holder``: the connection, whose ``taken_over`` makes it let go of the session
        (held as itself, not as a bound method: one object less per session)."""
        self.link = link
        self._on_takeover = holder
        for pid in sorted(self.pubrel):
            link.send(b"\x62\x02" + pid.to_bytes(2, "big"))
        if self.packet_ids:
            self._drop_stale_reservations()
        if self.queue is not None:
            self.sub = self.manager.subscribe(
                self.queue.name, self.client_id, self, self.max_inflight, dispatch=False
            )
        for member in self.shared.values():
            member.join()

    def _drop_stale_reservations(self) -> None:
        """Free the packet ids kept for messages that left the queue while the client was
        away (dropped by a bound, the queue replaced): no redelivery will reuse them."""
        waiting = set(self.packet_ids)
        present: set[str] = set()
        if self.queue is not None:
            for msg in self.queue.ready():
                if msg.id in waiting:
                    present.add(msg.id)
                    if len(present) == len(waiting):
                        return
        for msg_id in waiting - present:
            self._used.discard(self.packet_ids.pop(msg_id))

    def start_delivery(self) -> None:
        """After CONNACK: resend what the last connection left unacknowledged, then the rest."""
        if self.queue is not None:
            self.queue.dispatch()
        for member in self.shared.values():
            member.dispatch()

    def take_over(self) -> None:
        """Another connection CONNECTed with this client id: the one holding the session (if
        any) closes and leaves it (detached, or ended if clean)."""
        holder = self._on_takeover
        if self.link is not None and holder is not None:
            holder.taken_over()

    def detach(self) -> None:
        """The connection is gone: unacknowledged deliveries go back to the queue front."""
        self.link = None
        self._on_takeover = None
        self._backlog.clear()
        self.stalled = False
        self._release_publishers()
        self.outbound.clear()
        for pid in self.direct:
            self._used.discard(pid)
        self.direct.clear()
        self._pending.clear()
        self._pending_bytes = 0
        for pid in self.shared_out:
            self._used.discard(pid)
        self.shared_out.clear()
        for member in self.shared.values():
            member.leave()  # its unacknowledged messages go to the group's other members
        sub, self.sub = self.sub, None
        if sub is not None and not sub.queue.deleted:
            self.manager.unsubscribe(sub)

    # -- core Consumer -------------------------------------------------------------------------

    @property
    def writable(self) -> bool:
        link = self.link
        # The window counts what awaits the client (in flight, PUBREL owed). Ids kept for a
        # redelivery do not: the redelivery reuses its id, and counting them would leave a
        # client that went away with a full window nothing to receive ever again. The
        # second bound keeps a free id for a new message.
        return (
            link is not None
            and link.writable
            and not self._backlog
            and len(self.outbound) + len(self.direct) + len(self.pubrel) < self.max_inflight
            and len(self._used) < MAX_PACKET_ID
        )

    def deliver(self, sub: Subscription, msg: StoredMessage) -> None:
        link = self.link
        if link is None:  # not reachable: the subscription ends with the connection
            return
        pid = self.packet_ids.get(msg.id)
        if pid is None:
            pid = self._allocate()
            self.packet_ids = own(self.packet_ids)
            self.packet_ids[msg.id] = pid
        self.outbound = own(self.outbound)
        self.outbound[pid] = msg
        headers = msg.headers
        self.stats.messages_sent += 1
        send_publish(
            link,
            self._topic_bytes(headers[TOPIC]),
            msg.payload,
            2 if headers.get(QOS) == "2" else 1,
            pid,
            retain=RETAIN in headers,
            dup=msg.attempts > 1,
        )

    def _topic_bytes(self, topic: str) -> bytes:
        raw = self._topics.get(topic)
        if raw is None:
            if len(self._topics) >= 1024:
                self._topics.clear()
            self._topics = own(self._topics)
            raw = self._topics[topic] = topic.encode()
        return raw

    def subscription_cancelled(self, sub: Subscription, reason: str) -> None:
        self.sub = None

    def _allocate(self) -> int:
        used = self._used
        if used is _NO_IDS:
            used = self._used = set()
        pid = self._next_pid
        # Callers check len(_used) < max_inflight <= 65,535 first, so a free id exists.
        while pid in used:
            pid = pid % MAX_PACKET_ID + 1
        used.add(pid)
        self._next_pid = pid % MAX_PACKET_ID + 1
        return pid

    # -- acknowledgements from the client --------------------------------------------------------

    def puback(self, pid: int) -> bool:
        """PUBACK: settle the QoS 1 delivery; False when the id is not one we wait for."""
        direct = self.direct
        if pid in direct:
            if direct[pid] == 2:
                return False
            del direct[pid]
            self._used.discard(pid)
            return True
        if self.shared_direct:
            entry = self.shared_direct.pop(pid, None)
            if entry is not None:
                entry[0].direct -= 1
                self._used.discard(pid)
                return True
        msg = self.outbound.get(pid)
        if msg is None or msg.headers.get(QOS) == "2":
            return self._shared_ack(pid, 1) if self.shared_out else False
        del self.outbound[pid]
        self._settle(pid, msg)
        return True

    def _shared_ack(self, pid: int, qos: int) -> bool:
        """PUBACK (``qos`` 1) / PUBREC (2) of a shared subscription's delivery: settled in
        the group's queue."""
        entry = self.shared_out.get(pid)
        if entry is None or entry[2] != qos:
            return False
        del self.shared_out[pid]
        self._used.discard(pid)
        self.manager.ack(entry[0], entry[1].id, dispatch=False)
        return True

    def deliver_shared(self, sub: Subscription, msg: StoredMessage, granted: int) -> None:
        """A message of a shared subscription's group queue, at min(its QoS, granted)."""
        link = self.link
        if link is None:
            return
        headers = msg.headers
        topic = headers.get(TOPIC) or address_to_topic(msg.queue)
        payload = from_core(msg.payload, headers)
        qos = min(shared_qos(msg), granted)
        self.stats.messages_sent += 1
        if qos == 0:
            link.send(self.shared_packet(topic, payload, 0, 0, msg))
            self.manager.ack(sub, msg.id, dispatch=False)
            return
        pid = self._allocate()
        self.shared_out = own(self.shared_out)
        self.shared_out[pid] = (sub, msg, qos)
        link.send(self.shared_packet(topic, payload, qos, pid, msg))

    def deliver_direct(self, member: SharedMember, topic: str, payload: bytes, qos: int) -> None:
        """A message of the member's group straight from the publish (no queue): at
        min(``qos``, granted), QoS 1 remembered until its PUBACK (``take_direct`` when the
        member leaves first). The caller checked the member's window."""
        if member.granted < qos:
            qos = member.granted
        link = self.link
        assert link is not None
        pid = self._allocate() if qos else 0
        packet = self.direct_packet(member, topic, payload, qos, pid)
        self.stats.messages_sent += 1
        if packet is None:  # over the client's maximum size: as if delivered
            self._used.discard(pid)
            return
        if qos:
            self.shared_direct = own(self.shared_direct)
            self.shared_direct[pid] = (member, topic, payload, qos)
            member.direct += 1
        link.send(packet)

    def direct_packet(
        self, member: SharedMember, topic: str, payload: bytes, qos: int, pid: int
    ) -> bytes | None:
        """The PUBLISH of ``deliver_direct`` (a v5 session adds the subscription identifiers
        and keeps to the client's maximum packet size: None when over it)."""
        return encode_publish(self._topic_bytes(topic), payload, qos, pid)

    def take_direct(self, member: SharedMember) -> list[tuple[str, bytes, int]]:
        """The member's direct deliveries still awaiting PUBACK, forgotten here (the member
        is leaving: the caller gives them to the group)."""
        taken = [(pid, e) for pid, e in self.shared_direct.items() if e[0] is member]
        for pid, _ in taken:
            del self.shared_direct[pid]
            self._used.discard(pid)
        member.direct = 0
        return [(topic, payload, qos) for _, (_, topic, payload, qos) in taken]

    def shared_packet(
        self, topic: str, payload: bytes, qos: int, pid: int, msg: StoredMessage
    ) -> bytes:
        """The PUBLISH of a shared subscription's message (a v5 session adds properties)."""
        return encode_publish(topic.encode(), payload, qos, pid, dup=msg.attempts > 1)

    def pubrec(self, pid: int) -> None:
        """PUBREC: the QoS 2 delivery is the client's now; it settles here, PUBREL follows
        (the caller answers every PUBREC; only our own QoS 2 deliveries are tracked)."""
        if self.direct.get(pid) == 2:
            del self.direct[pid]
        else:
            msg = self.outbound.get(pid)
            if msg is None or msg.headers.get(QOS) != "2":
                if not (self.shared_out and self._shared_ack(pid, 2)):
                    return
                self._await_pubcomp(pid)
                return
            del self.outbound[pid]
            self._settle(pid, msg)
        self._await_pubcomp(pid)

    def _await_pubcomp(self, pid: int) -> None:
        """PUBREC came: ``pid`` stays in use until PUBCOMP."""
        self._used = _ids(self._used)
        self._used.add(pid)
        self.pubrel = _ids(self.pubrel)
        self.pubrel.add(pid)

    def add_pending(self, entry: tuple[Any, ...]) -> None:
        """``entry`` (topic, payload, ...) waits for the in-flight window, counted."""
        self._pending = pending = _items(self._pending)
        pending.append(entry)
        self._pending_bytes += len(entry[1])

    def remember_inbound_qos2(self, pid: int) -> None:
        """A QoS 2 publish from the client: its packet id is kept until PUBREL."""
        self.inbound_qos2 = _ids(self.inbound_qos2)
        self.inbound_qos2.add(pid)

    def pubcomp(self, pid: int) -> None:
        if pid in self.pubrel:
            self.pubrel.discard(pid)
            self._used.discard(pid)

    def _settle(self, pid: int, msg: StoredMessage) -> None:
        self.packet_ids.pop(msg.id, None)
        self._used.discard(pid)
        if self.sub is not None:
            # The caller refills once per read (refill), not once per ack.
            self.manager.ack(self.sub, msg.id, dispatch=False)

    def refill(self) -> None:
        """After acknowledgements: fill the in-flight window again."""
        if self.link is None:
            return
        if self.shared:
            for member in self.shared.values():
                member.dispatch()
        if self._pending:
            self._pump()
        elif self.queue is not None and self.queue.count:
            self.queue.dispatch()
        else:
            return
        self._check_drained()

    # -- messages for this client ----------------------------------------------------------------

    def send_qos0(self, packet: bytes) -> None:
        """A QoS 0 PUBLISH: now if the socket takes it, else a bounded backlog (the publisher
        is paused meanwhile, see ``congested``), else dropped."""
        link = self.link
        if link is None:
            return
        if not self._backlog and link.writable:
            self.stats.messages_sent += 1
            link.send(packet)
        elif len(self._backlog) < self.max_backlog:
            self._backlog = _items(self._backlog)
            self._backlog.append(packet)
        else:
            self.dropped_qos0 += 1
            self._lost()

    def _lost(self) -> None:
        """A message beyond this session's in-memory bounds was dropped (no core queue
        counts it): counted for the metrics and told in the log, rate-limited."""
        self.stats.messages_dropped += 1
        if self.drop_log is not None:
            total = self.dropped_qos0 + self.dropped_queued
            self.drop_log.dropped(self.client_id, "SessionBound", total)

    @property
    def congested(self) -> bool:
        """This connected client is falling behind (QoS 0 waiting for its socket, its queue
        half full, or ``mqtt.pause_publishers_bytes`` of payloads waiting): publishers to it
        should pause rather than have messages dropped or pile up in memory."""
        if self.link is None:
            return False
        if self._backlog:
            return True
        ctx = self._ctx
        queued = len(self._pending) if self.queue is None else self.queue.count
        return queued >= max(1, ctx.max_backlog // 2) or self.waiting_bytes >= ctx.pause_bytes

    @property
    def waiting_bytes(self) -> int:
        """The payload bytes waiting for this client in memory: its pending list's (a clean
        session) or its queue's."""
        queue = self.queue
        return self._pending_bytes if queue is None else queue.nbytes

    def when_drained(self, waiter: Callable[[], None]) -> None:
        if self.congested:
            if self._drain_waiters is _NO_WAITERS:
                self._drain_waiters = []
            self._drain_waiters.append(waiter)
        else:
            waiter()

    def _check_drained(self) -> None:
        if not self.congested:
            self.stalled = False
            if self._drain_waiters and self.waiting_bytes <= self._ctx.resume_bytes:
                self._release_publishers()

    def _release_publishers(self) -> None:
        waiters, self._drain_waiters = self._drain_waiters, _NO_WAITERS
        for waiter in waiters:
            waiter()

    def enqueue(self, topic: str, payload: bytes, qos: int, retain: bool = False) -> bool:
        """A QoS 1/2 message for this client; True when it will be journaled (the
        publisher's acknowledgement waits for the journal then)."""
        if self.queue is None:
            return self._enqueue_clean(topic, payload, qos, retain)
        key = (topic, qos, retain)
        headers = self._headers.get(key)
        if headers is None:
            # Messages share one (read-only) headers dict per topic and QoS.
            if len(self._headers) >= 1024:
                self._headers.clear()
            headers = {TOPIC: topic, QOS: "2" if qos == 2 else "1"}
            if retain:
                headers[RETAIN] = "1"
            self._headers = own(self._headers)
            self._headers[key] = headers
        outcome = self.manager.publish(
            self.queue.name, self._ctx.next_msg_id(), payload, headers, route=False
        )
        if not outcome.accepted:
            self.dropped_queued += 1
            return False
        return outcome is PublishOutcome.ACCEPTED_DURABLE

    def _enqueue_clean(self, topic: str, payload: bytes, qos: int, retain: bool) -> bool:
        """A clean session keeps its messages in memory only (they die with it): straight
        out when the window and the socket allow, else in a bounded list, else dropped."""
        pending = self._pending
        if not pending and self.writable:
            self._send_direct(topic, payload, qos, retain)
        elif len(pending) < self.max_backlog:
            self.add_pending((topic, payload, qos, retain))
        else:
            self.dropped_queued += 1
            self._lost()
        return False

    def _send_direct(self, topic: str, payload: bytes, qos: int, retain: bool) -> None:
        assert self.link is not None
        pid = self._allocate()
        direct = self.direct
        if direct is NO_ENTRIES:
            direct = self.direct = {}
        direct[pid] = qos
        self.stats.messages_sent += 1
        send_publish(self.link, self._topic_bytes(topic), payload, qos, pid, retain=retain)

    def _pump(self) -> None:
        link = self.link
        pending = self._pending
        if link is None or self._backlog:
            return
        # ``writable``'s window, counted once: each send takes one place and nothing frees
        # one meanwhile (a fan-out's subscribers refill here after every read of PUBACKs).
        room = min(
            self.max_inflight - len(self.outbound) - len(self.direct) - len(self.pubrel),
            MAX_PACKET_ID - len(self._used),
        )
        send = self._send_direct
        while pending and room > 0 and link.writable:
            entry = pending.popleft()
            self._pending_bytes -= len(entry[1])
            send(*entry)
            room -= 1

    def on_writable(self) -> None:
        link = self.link
        if link is None:
            return
        backlog = self._backlog
        while backlog and link.writable:
            self.stats.messages_sent += 1
            link.send(backlog.popleft())
        if not backlog:
            if self.shared:
                for member in self.shared.values():
                    member.dispatch()
            if self.queue is not None:
                self.queue.dispatch()
            else:
                self._pump()
            self._check_drained()
