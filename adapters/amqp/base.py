"""What every part of one AMQP connection's session shares: its state and its helpers.

``ConnectionBase`` holds one connection's negotiated limits, channels and per-read work (the
queues to refill, the confirms to send) and the helpers the method handlers share; the
handlers live in ``handshake.py`` (channel 0), ``declarations.py`` (exchange.*, queue.*) and
``basic.py`` (basic.*, confirm.*, tx.*), one subclass on the other (a single chain, not
mixins: mypyc compiles single inheritance only), and ``connection.AmqpConnection``, the last,
dispatches to them by table.

What a connection uses of the broker's AMQP side is the ``Server`` protocol below
(``server.AmqpServer`` implements it), so no module of the session imports the server.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import structlog

from vibemq_server.adapters.amqp.channel import AmqpConsumer, Channel
from vibemq_server.adapters.amqp.codec import (
    AmqpError,
    Frame,
    FrameParser,
    ReplyCode,
    encode_ack,
)
from vibemq_server.adapters.amqp.mapping import MessageMapper
from vibemq_server.adapters.amqp.states import TRANSITIONS, Event, Input, State
from vibemq_server.auth import Verdict
from vibemq_server.auth.authenticator import Offload
from vibemq_server.config import AmqpConfig
from vibemq_server.core import Queue, QueueManager, QueueOptions
from vibemq_server.core.durable_replies import DurableReplies
from vibemq_server.core.exchanges import Exchanges
from vibemq_server.core.permissions import BEFORE_LOGIN, Access
from vibemq_server.server.stats import ProtocolStats
from vibemq_server.server.transport import Link


class Server(Protocol):
    """What a connection uses of the AMQP side of the broker: settings, exchanges, queue
    declarations and their arguments, exclusive and auto-delete queues, routing, auth."""

    cfg: AmqpConfig
    manager: QueueManager
    mapper: MessageMapper
    exchanges: Exchanges | None
    #: exclusive queue name -> the connection that owns it (compared by identity)
    exclusive: dict[str, object]
    #: queue name -> its exclusive consumer
    exclusive_consumers: dict[str, AmqpConsumer]
    #: auto-delete queues: deleted when their last consumer goes
    auto_delete: set[str]
    #: the AMQP counters (messages in/out, errors by reply code), shared by every connection
    stats: ProtocolStats

    def login(
        self,
        username: str,
        password: str,
        peer_host: str,
        then: Callable[[Verdict], None],
        offload: Offload,
    ) -> bool: ...

    def access(self, user: str) -> Access: ...

    def next_msg_id(self) -> str: ...

    def queue_options(self, durable: bool, args: Mapping[str, Any]) -> QueueOptions: ...

    def declared(self, name: str, durable: bool, args: Mapping[str, Any]) -> None: ...

    def check_redeclare(
        self, queue: Queue, durable: bool, auto_delete: bool, args: Mapping[str, Any]
    ) -> None: ...

    def touch(self, name: str) -> None: ...

    def message_count(self, name: str) -> tuple[int, int]: ...

    def delete_queue(self, name: str) -> int: ...

    def publish(
        self, exchange: str, routing_key: str, properties: bytes, body: bytes
    ) -> tuple[int, bool, bool]: ...

    def consumer_ended(self, consumer: AmqpConsumer) -> None: ...

    def consumer_gone(self, queue_name: str) -> None: ...

    def connection_gone(self, conn: object) -> None: ...


#: frames held for a login: none (shared, never mutated: a hold makes a tuple of its own)
NOTHING_HELD: tuple[list[Frame], int, AmqpError | None] = ([], 0, None)
#: queues to refill after a read: none (shared, never added to: ``to_refill`` makes a
#: connection's own set; an idle connection keeps no set of 216 bytes)
NOTHING_TO_REFILL: frozenset[str] = frozenset()
#: a client that said nothing of its capabilities (shared, read only)
_NO_CAPABILITIES: dict[str, Any] = {}


class ConnectionBase:
    """One AMQP connection's state, and the helpers its handlers share."""

    # (slotted, as are the handler mixins and AmqpConnection: an idle connection costs only
    # what it holds)
    __slots__ = (
        "_accepts",
        "_confirms",
        "_durable",
        "_held_frames",
        "_published",
        "_refill",
        "access",
        "anonymous",
        "awaiting_login",
        "blocked",
        "capabilities",
        "channel_max",
        "channels",
        "client_properties",
        "closing_since",
        "conn_id",
        "frame_max",
        "heartbeat",
        "last_heartbeat_sent",
        "last_rx",
        "link",
        "log",
        "manager",
        "max_message_size",
        "opened_at",
        "parser",
        "refused_at",
        "send",
        "server",
        "state",
        "user",
        "username",
    )

    def __init__(self, link: Link, server: Server) -> None:
        self.link = link
        #: output to the peer (the link's own method: no wrapper call per frame)
        self.send: Callable[[bytes], None] = link.send
        self.server = server
        self.manager = server.manager
        self.conn_id = link.conn_id
        self.log: structlog.typing.FilteringBoundLogger = link.log
        cfg = server.cfg
        self.parser = FrameParser(cfg.frame_max, fuse_publish=True)
        self.state = State.AWAIT_HEADER
        #: what the current state accepts (the hot path reads the row, no Enum hashing)
        self._accepts = TRANSITIONS[State.AWAIT_HEADER]
        self.channels: dict[int, Channel] = {}
        self.frame_max = cfg.frame_max
        self.channel_max = cfg.channel_max
        self.max_message_size = cfg.max_message_size  # (read per publish)
        self.heartbeat = 0
        self.capabilities: dict[str, Any] = _NO_CAPABILITIES  # (read only; start-ok sets it)
        #: connection.start-ok's client properties (product, version, connection_name, ...)
        self.client_properties: dict[str, Any] = {}
        self.username = ""
        #: who the client logged in as (the authenticator's verdict)
        self.user: str | None = None
        self.anonymous = False
        #: what the user may do (set at login; until then nothing on a channel can run)
        self.access = BEFORE_LOGIN
        #: when a login was refused without a close method: the socket closes later
        self.refused_at: float | None = None
        #: a password hash is being verified off the loop (reading paused) ...
        self.awaiting_login = False
        #: ... and the frames of the read that came after the login, with its framing error
        self._held_frames: tuple[list[Frame], int, AmqpError | None] = NOTHING_HELD
        self.opened_at = link.time()
        self.last_rx = self.opened_at
        self.last_heartbeat_sent = self.opened_at
        self.closing_since = 0.0
        self.blocked = False
        self._published = False  # this read published something (memory alarm)
        #: queues to dispatch once the read is done (acks, recover, a new consumer, qos)
        self._refill: set[str] | frozenset[str] = NOTHING_TO_REFILL  # (its own: to_refill)
        #: publisher confirms to send once the read is done (not waiting for the journal)
        self._confirms: dict[Channel, list[int]] = {}
        #: publisher confirms that wait for the journal, by flush epoch
        self._durable: DurableReplies[tuple[Channel, int]] | None = None

    def to_refill(self) -> set[str]:
        """The set of queues to dispatch once the read is done, this connection's own."""
        refill = self._refill
        if isinstance(refill, set):
            return refill
        own: set[str] = set()
        self._refill = own
        return own

    # -- the state table ---------------------------------------------------------------------------

    def _fire(self, event: Input) -> None:
        """Move to the state the table gives for ``event`` in the current one."""
        self.state = state = TRANSITIONS[self.state][event]
        self._accepts = TRANSITIONS[state]

    def _fail(self, exc: AmqpError) -> None:
        """Answer a protocol error (connection.py)."""
        raise NotImplementedError

    def login_decided(self, decide: Callable[[], None]) -> None:
        """A login verified off the loop is decided: run ``decide``, then the held frames
        (connection.py)."""
        raise NotImplementedError

    # -- channels ----------------------------------------------------------------------------------

    def _stop_deliveries(self) -> None:
        """Before the channels are released one by one: releasing one dispatches its queues,
        which must not deliver to another channel of this connection that is going too
        (deliveries used to follow connection.close and close-ok; found by
        tests/unit/test_amqp_session_fuzz.py)."""
        for channel in self.channels.values():
            if Event.CLOSE_SENT in channel.accepts:  # open, or waiting for content
                channel.fire(Event.CLOSE_SENT)

    def _flush_confirms(self, channel: Channel) -> None:
        """Send the confirms this read gathered for ``channel`` now, ahead of a frame that
        ends it: nothing may follow a channel's close or close-ok, or connection.close, and
        they were gathered for publishes routed before it (found by
        tests/unit/test_amqp_session_fuzz.py)."""
        seqs = self._confirms.pop(channel, None)
        if seqs:
            self._send_confirms(channel, seqs)

    def _release_all(self) -> None:
        self._stop_deliveries()
        queues: set[str] = set()
        for channel in list(self.channels.values()):
            queues |= self._release_channel(channel)
        self.channels.clear()
        self.server.connection_gone(self)
        for name in queues:
            queue = self.manager.queues.get(name)
            if queue is not None:
                queue.dispatch()

    def _release_channel(self, channel: Channel) -> set[str]:
        consumer_queues = [c.queue for c in channel.consumers.values()]
        queues = channel.release()
        for name in consumer_queues:
            self.server.consumer_gone(name)
        return queues

    # -- shared by the queue and basic methods -----------------------------------------------------

    def _queue_name(self, channel: Channel, name: str) -> str:
        """An empty queue name means the channel's last declared queue, as in RabbitMQ."""
        name = name or channel.last_queue
        if not name:
            raise AmqpError(
                ReplyCode.NOT_FOUND, "NOT_FOUND - no previously declared queue", channel.number
            )
        if name.startswith("$"):
            # The adapters' own queues (the durable tables, MQTT sessions) are no client's:
            # queue.delete/purge/bind of "$amqp.bindings" lost the bindings at the next
            # restart (found by tests/unit/test_amqp_session_fuzz.py).
            raise AmqpError(
                ReplyCode.NOT_FOUND, f"NOT_FOUND - no queue '{name}' in vhost '/'", channel.number
            )
        return name

    def _existing_queue(self, channel: Channel, name: str, class_id: int, method_id: int) -> Queue:
        """The queue ``name`` (from ``_queue_name``, so never a ``$`` one), or 404."""
        queue = self.manager.queues.get(name)
        if queue is None:
            raise AmqpError(
                ReplyCode.NOT_FOUND,
                f"NOT_FOUND - no queue '{name}' in vhost '/'",
                channel.number,
                class_id,
                method_id,
            )
        return queue

    def _check_exclusive(
        self,
        channel: Channel,
        name: str,
        class_id: int,
        method_id: int,
        *,
        exclusive: bool | None = None,
    ) -> None:
        """405 for another connection's exclusive queue; with ``exclusive`` (a redeclare's
        flag) also when the queue's exclusivity is not that (RabbitMQ's strict check)."""
        owner = self.server.exclusive.get(name)
        if (owner is not None and owner is not self) or (
            exclusive is not None and exclusive != (owner is self)
        ):
            raise AmqpError(
                ReplyCode.RESOURCE_LOCKED,
                f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{name}' "
                "in vhost '/'. It could be originally declared on another connection or the "
                "exclusive property value does not match that of the original declaration.",
                channel.number,
                class_id,
                method_id,
            )

    def _exchanges(self) -> Exchanges:
        exchanges = self.server.exchanges
        assert exchanges is not None
        return exchanges

    def _send_confirms(self, channel: Channel, seqs: list[int]) -> None:
        """Acks for ``seqs``; a run that covers everything up to its last one is sent as one
        ack with ``multiple``."""
        if channel.closing or not seqs:
            return
        done = channel.confirmed_upto
        seqs.sort()
        if seqs[0] == done + 1 and seqs[-1] - seqs[0] == len(seqs) - 1:
            self.send(encode_ack(channel.number, seqs[-1], len(seqs) > 1))
            channel.confirmed_upto = seqs[-1]
        else:
            self.send(b"".join(encode_ack(channel.number, s, False) for s in seqs))
