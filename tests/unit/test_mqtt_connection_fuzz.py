"""Property tests of the MQTT connection state machine (``MqttConnection``) driven by Hypothesis.

Clients speak 3.1, 3.1.1 or 5.0 (a CONNECT of level 5 makes the rest of what that client sends
v5-encoded, and what it receives is read with the v5 parser): every socket starts as the
listener's ``MqttEntry``, as in the broker.

The connection is sans-IO: here it runs over ``TestLink``, a ``Link`` that does what the shared
``StreamTransport`` does (output gathered during a read and written when the read is done, a
bounded write buffer, paused reading, ``connection_lost`` from a later loop iteration) over a
recorded socket. Behind it, a real :class:`MqttServer` over a real :class:`QueueManager` (with a
journal in a temporary directory, or none); everything runs inside the test's event loop,
whose exception handler records errors raised in callbacks (flushes, journal waiters, resumed
reads). Properties:

1. no input (valid packets in any state, random bytes, packets cut anywhere, peers vanishing,
   write pauses, timer checks, memory pressure, VibeMQ publishes) makes the connection raise,
   here or in a loop callback;
2. what a client receives parses as server-to-client packets: one CONNACK first, then only
   PUBLISH/PUBACK/PUBREC/PUBREL/PUBCOMP/SUBACK/UNSUBACK/PINGRESP (nothing after a refusal),
   each PUBLISH on a topic one of its subscriptions matches; nothing is sent after the
   connection closed its link; once the clients acknowledge what they get, no publisher stays
   paused and no message stays queued; after shutdown no clean session is left;
3. the same packets fed in one chunk or byte by byte give the same output;
4. a connection that sends a malformed packet is closed, and the others go on working;
5. a publisher paused for a slow subscriber and/or for memory resumes, and every QoS 1/2
   publish gets its acknowledgement, in order;
6. with a journal, recovering it afterwards gives back the live durable state: the durable
   queues' messages (the VibeMQ queue MQTT publishes reach, the persistent sessions' queues),
   the retained messages and the persistent sessions' subscriptions.

The hold of a publisher runs out when the test says so (``expire_holds``), not by the clock,
so that every example runs the same way each time.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import tempfile
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from vibemq_server.adapters.mqtt.codec import MqttParser, MqttProtocolError, encode
from vibemq_server.adapters.mqtt.codec5 import Mqtt5Parser, encode5
from vibemq_server.adapters.mqtt.connection import MqttConnection
from vibemq_server.adapters.mqtt.connection5 import MqttEntry
from vibemq_server.adapters.mqtt.packets import (
    PROTOCOL_NAME_V31,
    Connack,
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
from vibemq_server.adapters.mqtt.packets5 import (
    Connack5,
    Connect5,
    Disconnect5,
    Properties,
    Puback5,
    Pubcomp5,
    Publish5,
    Pubrec5,
    Pubrel5,
    Suback5,
    SubOptions,
    Subscribe5,
    Unsuback5,
    Unsubscribe5,
)
from vibemq_server.adapters.mqtt.server import MqttServer
from vibemq_server.adapters.mqtt.topics import matches
from vibemq_server.auth import Authenticator
from vibemq_server.config import Config
from vibemq_server.core import QueueManager
from vibemq_server.journal import FsyncPolicy, Journal
from vibemq_server.protocol.bigcopy import Fill, read_through
from vibemq_server.protocol.names import valid_queue_name
from vibemq_server.server.adapter import AdapterContext
from vibemq_server.server.broker import with_payload_forms
from vibemq_server.server.transport import ReadBatch

SERVER_TO_CLIENT = (Publish, Puback, Pubrec, Pubrel, Pubcomp, Suback, Unsuback, Pingresp)
SERVER_TO_CLIENT5 = (Publish5, Puback5, Pubrec5, Pubrel5, Pubcomp5, Suback5, Unsuback5, Pingresp)
ACKS = (Puback, Pubrec, Pubcomp)
#: the broker's write_buffer_high_bytes here: a few deliveries fill it
OUT_LIMIT = 4096

# -- the test link -----------------------------------------------------------------------------


class TestLink:
    """The connection's ``Link``, doing what ``StreamTransport`` does with a socket, which is
    recorded: ``out`` is what the client received. Output given during a read is written when
    the read is done, otherwise at the end of the loop turn; over ``OUT_LIMIT`` unwritten bytes,
    or while the client does not read (``pause_writing``), the link is not writable, and
    writing it out (or the client reading again) tells the connection. ``close``/``abort``
    deliver ``connection_lost`` from a later loop iteration, as asyncio does; the peer going
    away delivers it at once."""

    __test__ = False  # not a test class, whatever its name

    peer_identity: str | None = None  # a plain connection
    over_tls = False

    def __init__(self, world: World, port: int) -> None:
        self.world = world
        self.loop = world.loop
        self.conn_id = f"mqtt_{port}"
        self.peer_host = "127.0.0.1"
        self.log = structlog.get_logger("vibemq.mqtt").bind(conn_id=self.conn_id)
        # the version picker, then (``replace_session``) the connection it picked
        self.session: MqttEntry | MqttConnection | None = None
        self.out = bytearray()
        self.late_sends: list[bytes] = []  # sent after the link was closed
        self.closed = False  # by the connection (close/abort) or by the peer
        self.lost = False  # connection_lost delivered (once)
        self._buffer: list[bytes] = []
        self._buffered = 0
        self._flush_scheduled = False
        self._write_paused = False
        self._reading_paused = False
        self._into: Fill | None = None  # read_into's

    # -- Link ---------------------------------------------------------------------------------

    @property
    def writable(self) -> bool:
        return not (self._write_paused or self.closed) and self._buffered < OUT_LIMIT

    @property
    def reading_paused(self) -> bool:
        return self._reading_paused

    def send(self, data: bytes) -> None:
        if self.closed:
            self.late_sends.append(data)
            return
        self._buffer.append(data)
        self._buffered += len(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            batch = self.world.batch
            if batch.reading:
                batch.dirty.append(self)
            else:
                self.loop.call_soon(self._flush)

    def send_parts(self, parts: Sequence[bytes | memoryview]) -> None:
        for part in parts:  # (a large delivery: its header, then its payload)
            self.send(bytes(part))

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._buffer or self.closed:
            return
        was_full = self._buffered >= OUT_LIMIT
        self.out += b"".join(self._buffer)
        self._buffer, self._buffered = [], 0
        if was_full and self.writable:
            self._writable_again()

    def _writable_again(self) -> None:
        if self.session is not None and not self.closed:
            try:
                self.session.writable_again()
            except Exception as exc:  # (the batch would only log it)
                self.world.errors.append({"exception": exc, "where": "writable_again"})
                raise

    def close(self) -> None:
        if self.closed:
            return
        self._flush()
        self.closed = True
        self.loop.call_soon(self._lose, None)

    def abort(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._buffer, self._buffered = [], 0
        self.loop.call_soon(self._lose, None)

    def pause_reading(self) -> None:
        if not self.closed:
            self._reading_paused = True

    def resume_reading(self) -> None:
        if not self.closed:
            self._reading_paused = False

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        self.loop.call_later(delay, callback)

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.loop.call_soon(callback)

    def offload(self, work: Callable[[], Any], then: Callable[[Any], None]) -> None:
        # as the transport: the result comes back on a later turn, unless closed meanwhile
        self.loop.call_soon(lambda: None if self.closed else then(work()))

    def time(self) -> float:
        return self.loop.time()

    def replace_session(self, session: MqttConnection) -> None:
        self.session = session

    # -- what the socket and the broker do (as StreamTransport passes them on) ----------------

    def read_into(self, fill: Fill) -> None:
        self._into = fill if len(fill) else None

    def data_received(self, data: bytes) -> None:
        """A read; while the connection has asked for its next bytes in a fill of its own
        (``read_into``), they go there first, as the transport reads them, and the
        connection gets ``data_received(b"")`` after each such read."""
        read_through(data, self._filling, self._deliver)

    def _filling(self) -> Fill | None:
        return None if self.closed else self._into

    def _deliver(self, data: bytes) -> None:
        if self.session is None or self.closed:
            return
        batch = self.world.batch
        batch.begin()
        try:
            self.session.data_received(data)  # no except: the test wants to see any error
        finally:
            batch.end()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._writable_again()

    def check_timers(self, now: float, keepalive: float, frame_timeout: float) -> None:
        if self.session is not None and not self.closed:
            self.session.check_timers(now, keepalive, frame_timeout)

    def shutdown(self, reason: str) -> None:
        if self.session is not None and not self.closed:
            self.session.shutdown(reason)
        else:
            self.close()

    def peer_gone(self, exc: Exception | None) -> None:
        self.closed = True
        self._lose(exc)

    def _lose(self, exc: Exception | None) -> None:
        if self.lost:
            return
        self.lost = True
        self.world.unregister(self)
        if self.session is not None:
            self.session.connection_lost(exc)


@dataclass
class Client:
    """One client connection: its link, what it sent, and what it received."""

    link: TestLink
    #: the session key its first CONNECT named (None before it sent one)
    session_key: str | None = None
    pending: list[bytes] = field(default_factory=list)  # sent while reading was paused
    acked: int = 0  # received packets already answered by ``ack``
    #: its first CONNECT was MQTT 5.0: it sends and reads v5
    v5: bool = False

    @property
    def conn(self) -> MqttConnection | None:
        """None when the broker's connection limit refused the socket."""
        session = self.link.session
        return session.conn if isinstance(session, MqttEntry) else session

    def received(self) -> list[Any]:
        parser: MqttParser | Mqtt5Parser = Mqtt5Parser() if self.v5 else MqttParser()
        packets = parser.feed(bytes(self.link.out))
        assert parser.buffered == 0, "a write ended inside a packet"
        return packets

    def wire(self, packets: Iterable[Packet]) -> bytes:
        """The packets as this client sends them (v5-encoded for a v5 client)."""
        if self.v5:
            return b"".join(encode5(to_v5(p)) for p in packets)
        return b"".join(encode(p) for p in packets)


def to_v5(packet: Any) -> Any:
    """The MQTT 5.0 form of a 3.1.1 packet the strategies drew (a persistent session keeps a
    session expiry interval, as clean session 0 did)."""
    if isinstance(packet, Connect):
        return Connect5(
            packet.client_id,
            packet.clean_session,
            packet.keep_alive,
            Properties(session_expiry_interval=None if packet.clean_session else 300),
            packet.will_topic,
            packet.will_payload,
            packet.will_qos,
            packet.will_retain,
            Properties(),
            packet.username,
            packet.password if packet.username is not None else None,
        )
    if isinstance(packet, Publish):
        return Publish5(
            packet.topic, packet.payload, packet.qos, packet.retain, packet.dup, packet.packet_id
        )
    if isinstance(packet, Subscribe):
        return Subscribe5(
            packet.packet_id, tuple((f, SubOptions(q)) for f, q in packet.subscriptions)
        )
    if isinstance(packet, Unsubscribe):
        return Unsubscribe5(packet.packet_id, packet.topic_filters)
    if isinstance(packet, Disconnect):
        return Disconnect5()
    for old, new in ((Puback, Puback5), (Pubrec, Pubrec5), (Pubrel, Pubrel5), (Pubcomp, Pubcomp5)):
        if isinstance(packet, old):
            return new(packet.packet_id)
    return packet


class World:
    """One broker side (server, manager, journal) and the clients connected to it."""

    def __init__(self, server: MqttServer, errors: LoopErrors) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.batch = server.batch
        self.errors = errors.errors
        self.clients: list[Client] = []  # every client ever connected
        self.registered: set[TestLink] = set()
        self.max_connections = 3
        #: session key -> every filter any of its connections subscribed to
        self.filters: dict[str, set[str]] = {}
        self._ports = iter(range(40_000, 65_000))
        self._anonymous = 0

    def register(self, link: TestLink) -> bool:
        if len(self.registered) >= self.max_connections:
            return False
        self.registered.add(link)
        return True

    def unregister(self, link: TestLink) -> None:
        self.registered.discard(link)

    def connect(self) -> Client:
        """A socket accepted, as StreamTransport takes it: a session only under the broker's
        connection limit (over it, the socket is closed without a word, as today)."""
        link = TestLink(self, next(self._ports))
        if self.register(link):
            link.session = self.server.new_session(link)
        else:
            link.closed = link.lost = True
        client = Client(link)
        self.clients.append(client)
        return client

    def note_sent(self, client: Client, packets: Iterable[Packet]) -> None:
        """Remember the client's session and filters, for the routing check."""
        for packet in packets:
            if isinstance(packet, Connect) and client.session_key is None:
                client.v5 = packet.protocol_level == 5 and packet.protocol_name == "MQTT"
                key = packet.client_id
                if not key:
                    self._anonymous += 1
                    key = f"\x00anonymous-{self._anonymous}"
                client.session_key = key
            elif isinstance(packet, Subscribe) and client.session_key is not None:
                self.filters.setdefault(client.session_key, set()).update(
                    f for f, _ in packet.subscriptions
                )

    def feed(self, client: Client, chunks: Iterable[bytes]) -> None:
        """The bytes arrive as a socket would hand them over: not after a close, not while
        reading is paused (they wait, see ``pump``)."""
        for chunk in chunks:
            if client.link.closed:
                return
            if client.link.reading_paused or client.pending:
                client.pending.append(chunk)
            else:
                client.link.data_received(chunk)

    def pump(self) -> None:
        for client in self.clients:
            while client.pending and not client.link.reading_paused:
                if client.link.closed:
                    client.pending.clear()
                    break
                client.link.data_received(client.pending.pop(0))

    def live(self) -> list[Client]:
        return [c for c in self.clients if not c.link.closed]


async def settle(world: World | None = None, rounds: int = 6) -> None:
    """Let call_soon callbacks (flushes, journal waiters, connection_lost) run."""
    for _ in range(rounds):
        await asyncio.sleep(0)
        if world is not None:
            world.pump()


class LoopErrors:
    """Exceptions that escaped into the event loop (they would only be logged otherwise)."""

    def __init__(self) -> None:
        self.errors: list[dict[str, Any]] = []

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        self.errors.append(context)


MQTT_SETTINGS: dict[str, Any] = {
    "deny_subscribe": ["secret/#"],
    "deny_publish": ["ro/#"],
    "max_retained": 3,
    # Never by the clock (tests stay deterministic): see expire_holds.
    "max_publisher_pause_s": 3600.0,
    "max_inflight": 2,
    "max_queued_messages": 4,
}


def make_config(auth: bool, **mqtt: Any) -> Config:
    settings_ = {**MQTT_SETTINGS, **mqtt}
    if auth:
        settings_["users"] = {"u": "pw"}
    # Refusals at once: the held-back refusal of a failed login is tested over sockets
    # (test_auth.py); here every run must end with nothing paused.
    return Config(
        auth_tokens=["token"] if auth else [],
        write_buffer_high_bytes=OUT_LIMIT,
        mqtt=settings_,
        auth_failure_delay_s=0,
    )


def make_server(config: Config, manager: QueueManager) -> MqttServer:
    """An MQTT server (its listener never opened) whose connection registry is the world's."""
    server = MqttServer(
        AdapterContext(
            config, manager, lambda _c: True, lambda _c: None, ReadBatch(), Authenticator(config)
        )
    )
    server.restore()
    return server


@contextlib.asynccontextmanager
async def broker(
    *,
    journal: bool,
    auth: bool = False,
    memory: int = 512 * 1024 * 1024,
    journal_dir: Path | None = None,
    **mqtt: Any,
) -> AsyncIterator[tuple[World, LoopErrors]]:
    """``journal_dir``: where the journal goes (it is kept there after the test, for a replay);
    else a temporary directory."""
    loop = asyncio.get_running_loop()
    errors = LoopErrors()
    old_handler = loop.get_exception_handler()
    loop.set_exception_handler(errors)
    config = make_config(auth, **mqtt)
    with tempfile.TemporaryDirectory() as tmp:
        manager = QueueManager(
            config.queue_defaults, memory_high_watermark=memory, name_validator=valid_queue_name
        )
        store: Journal | None = None
        if journal:
            store = with_payload_forms(
                Journal(journal_dir or Path(tmp) / "journal", fsync=FsyncPolicy.NEVER)
            )
            store.recover(manager)
            store.start(manager)
            manager.persistence = store
        # VibeMQ queues that MQTT publishes reach: a durable one and a transient one.
        manager.create_queue("orders")
        manager.create_queue("a.b", manager.options_from({"durable": False}))
        world = World(make_server(config, manager), errors)
        try:
            yield world, errors
        finally:
            for client in world.clients:  # whatever a failed example left open
                if not client.link.lost:
                    client.link.peer_gone(None)
            if store is not None:
                await store.close()
            loop.set_exception_handler(old_handler)


# -- checks ------------------------------------------------------------------------------------


def check_output(world: World, client: Client) -> list[Packet]:
    """Property 2 for one client: well-formed, server-to-client only, CONNACK first and once,
    publishes only on subscribed topics, nothing written after the close (and in v5 a
    server DISCONNECT, if any, last)."""
    assert not client.link.late_sends, "sent after the connection closed its link"
    packets = client.received()
    if not packets:
        return packets
    first, rest = packets[0], packets[1:]
    allowed, publish = (SERVER_TO_CLIENT5, Publish5) if client.v5 else (SERVER_TO_CLIENT, Publish)
    assert isinstance(first, Connack5 if client.v5 else Connack), f"first packet {first!r}"
    if (first.reason_code if isinstance(first, Connack5) else first.return_code) != 0:
        assert not rest, f"packets after a refused CONNECT: {rest!r}"
        assert client.link.closed
        return packets
    if client.v5 and rest and isinstance(rest[-1], Disconnect5):
        assert rest[-1].reason_code >= 0x80, rest[-1]
        assert client.link.closed
        rest = rest[:-1]
    filters = world.filters.get(client.session_key or "", set())
    for packet in rest:
        assert isinstance(packet, allowed), f"{packet!r} is not server-to-client"
        if isinstance(packet, publish):
            assert any(matches(f, packet.topic) for f in filters), (
                f"PUBLISH on {packet.topic!r} matches none of {sorted(filters)}"
            )
    return packets


def check_end(world: World, errors: LoopErrors) -> None:
    assert not errors.errors, errors.errors
    for client in world.clients:
        check_output(world, client)
        assert client.link.closed and client.link.lost
    assert not world.registered
    for session in world.server.sessions.values():
        assert not session.clean, f"clean session {session.client_id} outlived its connection"
        assert session.link is None
    for client in world.clients:
        assert client.conn is None or client.conn.closed


# -- strategies --------------------------------------------------------------------------------

CLIENT_IDS = ["a", "b", "c", "a", "b", "", "x" * 24]
# (Hypothesis favours both ends of a list: the common cases go there.)
TOPICS = ["a/b", "a", "a/b/c", "/", "a//b", "$SYS/x", "$mqtt/s", "orders", "secret/x", "ro/x"]
TOPICS += ["a", "a/b"]
FILTERS = ["a/#", "#", "+", "a/+", "+/b", "a/b", "$SYS/#", "$SYS/+", "+/+", "orders", "secret/#"]
FILTERS += ["/#", "ro/x", "$mqtt/#", "a/b", "#"]

qos_levels = st.integers(0, 2)
packet_ids = st.integers(1, 5)
payloads = st.one_of(
    st.sampled_from([b"", b"{}", b'{"k":1}', b'"s"', b"\xff\x00", b"x" * 300]),
    st.binary(max_size=16),
)


@st.composite
def connects(draw: st.DrawFn, client_ids: list[str] = CLIENT_IDS) -> Connect:
    version = draw(st.sampled_from([4, 4, 3, 5, 4]))
    v31 = version == 3
    will = draw(st.none() | st.tuples(st.sampled_from(TOPICS), payloads, qos_levels, st.booleans()))
    credentials = draw(
        st.sampled_from(
            [None, None, ("u", b"pw"), ("u", None), ("u", b"pw"), ("u", b"no"), ("z", b"token")]
        )
    )
    return Connect(
        client_id=draw(st.sampled_from(client_ids)),
        clean_session=draw(st.booleans()),
        keep_alive=draw(st.sampled_from([0, 0, 1, 2, 60])),
        protocol_name=PROTOCOL_NAME_V31 if v31 else "MQTT",
        protocol_level=version,
        will_topic=will[0] if will else None,
        will_payload=will[1] if will else b"",
        will_qos=will[2] if will else 0,
        will_retain=will[3] if will else False,
        username=credentials[0] if credentials else None,
        password=credentials[1] if credentials else None,
    )


@st.composite
def publishes(draw: st.DrawFn) -> Publish:
    qos = draw(qos_levels)
    return Publish(
        topic=draw(st.sampled_from(TOPICS)),
        payload=draw(payloads),
        qos=qos,
        retain=draw(st.booleans()),
        dup=qos > 0 and draw(st.booleans()),
        packet_id=draw(packet_ids) if qos else None,
    )


subscribes = st.builds(
    Subscribe,
    packet_id=packet_ids,
    subscriptions=st.lists(
        st.tuples(st.sampled_from(FILTERS), qos_levels), min_size=1, max_size=3
    ).map(tuple),
)
unsubscribes = st.builds(
    Unsubscribe,
    packet_id=packet_ids,
    topic_filters=st.lists(st.sampled_from(FILTERS), min_size=1, max_size=2).map(tuple),
)


#: What a client may send once connected (DISCONNECT aside).
def weighted(*choices: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """One of the strategies, each about ``weight`` times as likely. The first one is also
    what it shrinks to, and it takes both ends of the range Hypothesis draws from (which it
    favours), so that a rare choice stays rare."""
    (first_weight, first), *rest = choices
    pool = [first] * (first_weight - first_weight // 2)
    pool += [s for weight, s in rest for _ in range(weight)]
    pool += [first] * (first_weight // 2)
    return st.sampled_from(pool).flatmap(lambda s: s)


session_packets: st.SearchStrategy[Packet] = weighted(
    (6, publishes()),
    (3, subscribes),
    (1, unsubscribes),
    (1, st.builds(Puback, packet_ids)),
    (1, st.builds(Pubrec, packet_ids)),
    (1, st.builds(Pubrel, packet_ids)),
    (1, st.builds(Pubcomp, packet_ids)),
    (1, st.just(Pingreq())),
)


#: Mostly what a connected client sends; now and then a DISCONNECT or a (second) CONNECT.
client_packets: st.SearchStrategy[Packet] = weighted(
    (40, session_packets), (1, st.just(Disconnect())), (1, connects())
)


def _raises(data: bytes) -> bool:
    # The broker's own limit: under a smaller one, a packet the connection rightly waits
    # for (it announces more than the filter's limit but less than the broker's) would count.
    try:
        MqttParser(Config().mqtt.max_packet_size).feed(data)
    except MqttProtocolError:
        return True
    return False


#: Complete input that a connected client must not send: each closes the connection.
MALFORMED = [
    b"\x00\x00",  # reserved packet type 0
    b"\xf0\x00",  # reserved packet type 15
    b"\x36\x00",  # PUBLISH QoS 3
    b"\x38\x03\x00\x01a",  # DUP on QoS 0
    b"\x30\xff\xff\xff\xff\x01",  # a 5th length byte
    b"\x30\xff\xff\xff\x7f",  # over max_packet_size (256 MiB - 1 announced)
    b"\x30\x05\x00\x03a/#",  # wildcard in a topic name
    b"\x30\x04\x00\x02\xff\xfe",  # topic not UTF-8
    b"\x30\x05\x00\x03a\x00b",  # U+0000 in a topic
    b"\x32\x05\x00\x01a\x00\x00",  # packet id 0
    b"\x40\x02\x00\x00",  # PUBACK id 0
    b"\x40\x03\x00\x01\x00",  # PUBACK of the wrong length
    b"\x60\x02\x00\x01",  # PUBREL with flags 0
    b"\x82\x02\x00\x01",  # SUBSCRIBE without filters
    b"\x82\x06\x00\x01\x00\x01a\x03",  # SUBSCRIBE QoS 3
    b"\x82\x07\x00\x01\x00\x02a#\x00",  # a bad filter
    b"\xa2\x02\x00\x01",  # UNSUBSCRIBE without filters
    b"\xc0\x01\x00",  # PINGREQ with a body
    b"\x30\x01\x00",  # PUBLISH truncated in its topic
]
#: Well-formed packets a connected client must not send.
WRONG_STATE = [
    encode(Connack()),
    encode(Suback(1, (0,))),
    encode(Unsuback(1)),
    encode(Pingresp()),
    encode(Connect("again")),
]
bad_input = st.one_of(
    st.sampled_from(MALFORMED + WRONG_STATE),
    st.binary(min_size=1, max_size=12).filter(_raises),
)
#: Any bytes at all, for a connection in any state.
noise = st.one_of(
    bad_input,
    st.binary(max_size=24),
    st.sampled_from(
        [
            encode(Connect("p", protocol_level=6)),  # CONNACK 1
            encode(Connect("p", protocol_level=5)),  # v5 without properties: CONNACK 0x81
            encode(Connect("", protocol_name=PROTOCOL_NAME_V31, protocol_level=3)),  # CONNACK 2
            encode(Connect("p", protocol_name="AMQP")),
            b"\x10\x0c\x00\x04MQTT\x04\x03\x00\x00\x00\x00",  # reserved CONNECT flag
        ]
    ),
)


@st.composite
def chunked(draw: st.DrawFn, data: bytes) -> list[bytes]:
    """``data`` as one chunk, byte by byte, or cut at random points."""
    how = draw(st.sampled_from(["whole", "whole", "bytes", "cuts"]))
    if how == "whole" or len(data) < 2:
        return [data]
    if how == "bytes":
        return [data[i : i + 1] for i in range(len(data))]
    cuts = sorted(draw(st.sets(st.integers(1, len(data) - 1), max_size=4)))
    edges = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


@st.composite
def send_ops(draw: st.DrawFn) -> tuple[Any, ...]:
    """A write by one client: packets, then maybe some noise, cut anyhow."""
    slot = draw(st.integers(0, 2))
    packets = draw(st.lists(client_packets, min_size=1, max_size=6))
    data = b"".join(encode(p) for p in packets)
    if draw(st.integers(0, 29)) == 0:
        data += draw(noise)
    return ("send", slot, packets, draw(chunked(data)))


slots = st.integers(0, 2)


@st.composite
def openings(draw: st.DrawFn, slot: int) -> list[Packet]:
    """What a new connection in ``slot`` sends first: a CONNECT, mostly with the slot's own
    client id (so that connections mostly live side by side), sometimes with a shared one
    (takeover), and mostly a SUBSCRIBE; or nothing at all."""
    connect = draw(
        weighted((8, connects(client_ids=[f"c{slot}"])), (3, connects()), (1, st.none()))
    )
    if connect is None:
        return []
    return [
        connect,
        *draw(weighted((3, st.lists(subscribes, min_size=1, max_size=1)), (1, st.just([])))),
    ]


@st.composite
def reconnects(draw: st.DrawFn) -> tuple[Any, ...]:
    slot = draw(slots)
    return ("reconnect", slot, draw(openings(slot)))


operations = weighted(
    (12, send_ops()),
    (3, st.tuples(st.just("tick"))),
    (4, st.tuples(st.just("ack"), slots)),
    (2, st.tuples(st.just("pause_writing"), slots)),
    (2, st.tuples(st.just("resume_writing"), slots)),
    (1, st.tuples(st.just("timers"), slots, st.sampled_from([0.0, 1.0, 2.5, 5.0, 20.0, 100.0]))),
    (1, st.tuples(st.just("peer_gone"), slots, st.booleans())),
    (3, reconnects()),
    (1, st.tuples(st.just("expire"))),
    (1, st.tuples(st.just("drain"))),
    (
        1,
        st.tuples(
            st.just("native"),
            st.sampled_from(["orders", "a.b"]),
            st.sampled_from(
                [
                    ({}, b'{"k":1}'),
                    ({"payloadEncoding": "base64"}, b'"AAEC"'),
                    ({"payloadEncoding": "base64"}, b'"not base64!"'),
                    ({"payloadEncoding": "base64"}, b"[1]"),
                ]
            ),
        ),
    ),
)


def acks_for(packets: list[Any]) -> list[Packet]:
    """What a well-behaved client answers to what it received (3.1.1 forms: ``wire`` makes
    them v5 for a v5 client)."""
    out: list[Packet] = []
    for packet in packets:
        if isinstance(packet, Publish | Publish5) and packet.qos and packet.packet_id:
            out.append(Puback(packet.packet_id) if packet.qos == 1 else Pubrec(packet.packet_id))
        elif isinstance(packet, Pubrel | Pubrel5):
            out.append(Pubcomp(packet.packet_id))
    return out


def rechunk(data: bytes, like: list[bytes]) -> list[bytes]:
    """``data`` cut as ``like`` was: whole, byte by byte, or at the same offsets."""
    if len(like) <= 1:
        return [data]
    if all(len(c) == 1 for c in like):
        return [data[i : i + 1] for i in range(len(data))]
    edges = [0, *itertools.accumulate(len(c) for c in like[:-1])]
    edges = sorted({min(e, len(data)) for e in edges} | {len(data)})
    return [data[a:b] for a, b in itertools.pairwise(edges) if b > a]


async def acknowledge_all(world: World, client: Client) -> bool:
    """The client acknowledges what it receives until nothing more comes (the in-flight
    window is small); whether it had anything to acknowledge."""
    answered = False
    for _ in range(100):
        received = client.received()
        answers = acks_for(received[client.acked :])
        client.acked = len(received)
        if not answers or client.link.closed:
            break
        answered = True
        world.feed(client, [client.wire(answers)])
        await settle(world)
    return answered


def expire_holds(world: World) -> None:
    """What the broker does when a held publisher's pause (``max_publisher_pause_s``) runs
    out: done here rather than by the clock, so that an example always runs the same way."""
    for client in world.clients:
        conn = client.conn
        pause = conn._pause if conn is not None else None
        if conn is not None and pause is not None and pause.timer is not None:
            pause.timer.cancel()
            conn._hold_expired()


def check_nothing_stuck(world: World) -> None:
    """After ``quiesce``: no message waits for a connected client that acknowledges all."""
    for client in world.live():
        session = client.conn.session if client.conn is not None else None
        if client.conn is not None and client.conn.parser.buffered:
            # The client left half a packet (random bytes): its acknowledgements are read
            # as the rest of that packet, which the packet timeout ends, not a delivery.
            continue
        if session is not None and session.link is client.link:
            queued = session.queue.count if session.queue is not None else 0
            assert not (session._backlog or session._pending or queued), (
                f"{session.client_id}: messages stuck with nothing in flight"
            )


async def quiesce(world: World) -> None:
    """Every client acknowledges all it gets; a held publisher waits for its subscribers as
    long as they make progress, then its pause runs out."""
    for _ in range(100):
        await settle(world)
        answered = [await acknowledge_all(world, c) for c in world.live()]
        if not any(answered):
            if not any(c.link.reading_paused or c.pending for c in world.live()):
                return
            expire_holds(world)


# -- 1 and 2: anything goes, the output stays protocol -----------------------------------------


@example(
    # half a PUBLISH left in its parser swallowed a client's acknowledgements (found by
    # Hypothesis: the check must not call that a stuck delivery)
    journal=False,
    auth=True,
    max_connections=3,
    memory=10**9,
    first=tuple(
        [
            Connect(
                client_id=f"c{n}",
                clean_session=False,
                protocol_name="MQIsdp",
                protocol_level=3,
                username="u" if n != 1 else None,
                password=b"pw" if n != 1 else None,
            ),
            Subscribe(1, (("a/#", 0),)),
        ]
        for n in range(3)
    ),
    ops=[
        (
            "send",
            2,
            [Subscribe(1, (("$mqtt/#", 1),)), Publish("$mqtt/s", b"", 1, packet_id=1)],
            [b"\x82\x0c\x00\x01\x00\x07$mqtt/#\x012\x0b\x00\x07$mqtt/s\x00\x010\xb5"],
        ),
        ("send", 0, [Publish("$mqtt/s", b"", 1, packet_id=1)], [b"2\x0b\x00\x07$mqtt/s\x00\x01"]),
        ("send", 0, [Publish("$mqtt/s", b"", 1, packet_id=2)], [b"2\x0b\x00\x07$mqtt/s\x00\x02"]),
    ]
    + [("tick",)] * 8,
)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    journal=st.booleans(),
    auth=st.integers(0, 5).map(lambda n: n == 3),
    max_connections=st.sampled_from([2, 3, 3]),
    memory=st.sampled_from([10**9, 300]),
    first=st.tuples(*(openings(slot) for slot in range(3))),
    ops=st.lists(operations, min_size=10, max_size=50),
)
async def test_no_input_breaks_the_state_machine(
    journal: bool,
    auth: bool,
    max_connections: int,
    memory: int,
    first: tuple[list[Packet], ...],
    ops: list[tuple[Any, ...]],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        journal_dir = Path(tmp) / "journal"
        live = await _run_anything(journal, auth, max_connections, memory, first, ops, journal_dir)
        if journal:  # 6: the journal replays to the live durable state
            config = make_config(auth)
            recovered = QueueManager(config.queue_defaults, name_validator=valid_queue_name)
            with_payload_forms(Journal(journal_dir)).recover(recovered)
            assert durable_state(make_server(config, recovered)) == live


async def _run_anything(
    journal: bool,
    auth: bool,
    max_connections: int,
    memory: int,
    first: tuple[list[Packet], ...],
    ops: list[tuple[Any, ...]],
    journal_dir: Path,
) -> dict[str, Any]:
    """Properties 1 and 2; the durable state the broker was left with."""
    async with broker(journal=journal, auth=auth, memory=memory, journal_dir=journal_dir) as (
        world,
        errors,
    ):
        loop = world.loop
        manager = world.server.manager
        world.max_connections = max_connections
        slots_: list[Client] = [world.connect() for _ in range(3)]
        for client, opening in zip(slots_, first, strict=True):
            world.note_sent(client, opening)
            world.feed(client, [client.wire(opening)])
        await settle(world)

        for op in ops:
            kind = op[0]
            if kind == "send":
                _, slot, packets, chunks = op
                client = slots_[slot]
                if not client.link.closed:
                    world.note_sent(client, packets)
                if client.v5:
                    # the same packets v5-encoded, and the same noise after them
                    sent = b"".join(chunks)
                    noise = sent[len(b"".join(encode(p) for p in packets)) :]
                    chunks = rechunk(client.wire(packets) + noise, chunks)
                world.feed(client, chunks)
            elif kind == "tick":
                await settle(world)
            elif kind == "expire":
                expire_holds(world)
                await settle(world)
            elif kind == "ack":
                client = slots_[op[1]]
                received = client.received()
                answers = acks_for(received[client.acked :])
                client.acked = len(received)
                if answers and not client.link.closed:
                    world.feed(client, [client.wire(answers)])
            elif kind == "pause_writing":
                client = slots_[op[1]]
                if not client.link.closed:
                    client.link.pause_writing()
            elif kind == "resume_writing":
                client = slots_[op[1]]
                if not client.link.closed:
                    client.link.resume_writing()
            elif kind == "timers":
                client = slots_[op[1]]
                if not client.link.lost:
                    client.link.check_timers(loop.time() + op[2], 60.0, 10.0)
            elif kind == "peer_gone":
                client = slots_[op[1]]
                if not client.link.lost:
                    client.link.peer_gone(ConnectionResetError() if op[2] else None)
            elif kind == "reconnect":
                if slots_[op[1]].link.closed:
                    client = slots_[op[1]] = world.connect()
                    world.note_sent(client, op[2])
                    world.feed(client, [client.wire(op[2])])
            elif kind == "native":
                headers, body = op[2]
                manager.publish(op[1], world.server.next_msg_id(), body, headers)
            elif kind == "drain":  # a VibeMQ consumer empties the queue MQTT publishes reach
                manager.delete_queue("orders")
                manager.create_queue("orders")
                manager.tick()
            else:  # pragma: no cover
                raise AssertionError(kind)
            world.pump()

        # Everyone reads again and memory is free: a publisher held for a slow subscriber or
        # paused for memory goes on.
        for client in world.live():
            client.link.resume_writing()
        manager.memory_low = manager.memory_high = 10**12
        manager.tick()
        # Clients that acknowledge everything get everything still queued for them.
        await quiesce(world)
        paused = [c.link.conn_id for c in world.live() if c.link.reading_paused]
        assert not paused, f"reading still paused: {paused}"
        check_nothing_stuck(world)

        # Broker shutdown.
        for client in world.live():
            client.link.shutdown("server_shutdown")
        await settle(world)
        check_end(world, errors)
        return durable_state(world.server)


def durable_state(server: MqttServer) -> dict[str, Any]:
    """What the journal must keep: the messages of every durable queue (ready or in flight),
    the retained messages and the persistent sessions' subscriptions."""
    manager = server.manager
    tables = {t.queue.name for t in (server.retained, server.session_table) if t is not None}
    queues: dict[str, list[str]] = {}
    for name, queue in manager.queues.items():
        if queue.options.durable and name not in tables:
            ids = [m.id for m in queue.ready()]
            for sub in queue.subscriptions:
                ids.extend(m.id for m in sub.inflight.values())
            queues[name] = sorted(ids)
    assert server.retained is not None
    return {
        "queues": queues,
        "retained": {t: (m.payload, m.headers) for t, m in server.retained.items()},
        "sessions": {c: s.filters for c, s in server.sessions.items() if not s.clean},
    }


# -- 3: chunking does not change the output ----------------------------------------------------


async def _run_single(
    packets: list[Packet], how: str, journal: bool, cuts: list[int] | None = None
) -> tuple[list[Packet], bool]:
    """``how``: the input in one read, a read per byte, or cut at ``cuts`` (offsets)."""
    async with broker(journal=journal) as (world, errors):
        client = world.connect()
        world.note_sent(client, packets)
        data = client.wire(packets)
        if how == "whole":
            world.feed(client, [data])
        elif how == "cuts":
            edges = [0, *sorted(c for c in set(cuts or ()) if 0 < c < len(data)), len(data)]
            for a, b in itertools.pairwise(edges):
                world.feed(client, [data[a:b]])
                await settle(world, 1)
        else:
            for i in range(len(data)):
                world.feed(client, [data[i : i + 1]])
                await settle(world, 1)
        await settle(world)
        received = check_output(world, client)
        closed = client.link.closed
        if not closed:
            client.link.shutdown("server_shutdown")
            await settle(world)
        check_end(world, errors)
        return received, closed


def _kinds(packets: list[Packet]) -> tuple[list[Packet], list[Packet]]:
    """The acknowledgements of client publishes, and the rest: each in its own order."""
    acks = [p for p in packets if isinstance(p, (*ACKS, Puback5, Pubrec5, Pubcomp5))]
    return acks, [p for p in packets if p not in acks]


def _same_ids(packets: list[Any]) -> list[Any]:
    """A v5 CONNACK's assigned client identifier is random: one stand-in for comparing."""
    out = []
    for p in packets:
        if isinstance(p, Connack5) and p.properties.assigned_client_identifier:
            p = dataclasses.replace(
                p,
                properties=dataclasses.replace(p.properties, assigned_client_identifier="auto"),
            )
        out.append(p)
    return out


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    connect=connects(client_ids=["a", ""]).filter(lambda c: c.username is None),
    packets=st.lists(st.one_of(session_packets, st.just(Disconnect())), max_size=12),
    journal=st.booleans(),
)
async def test_chunking_does_not_change_the_output(
    connect: Connect, packets: list[Packet], journal: bool
) -> None:
    sequence = [connect, *packets]
    whole, whole_closed = await _run_single(sequence, "whole", journal)
    single, single_closed = await _run_single(sequence, "bytes", journal)
    whole, single = _same_ids(whole), _same_ids(single)
    assert whole_closed == single_closed
    if not journal:
        assert whole == single
        return
    # An acknowledgement waits for the journal; other packets need not wait behind it.
    whole_acks, whole_rest = _kinds(whole)
    single_acks, single_rest = _kinds(single)
    assert whole_rest == single_rest
    if any(isinstance(p, Disconnect) for p in packets):
        # A DISCONNECT read with the publishes closes before the journal had its turn: the
        # acknowledgements still waiting for it are not sent (a client that wanted them
        # would have waited for them before disconnecting).
        assert single_acks[: len(whole_acks)] == whole_acks
    else:
        assert whole_acks == single_acks


#: A large PUBLISH (issue 16): ~200 KB, a 3-byte remaining length.
BIG_PAYLOAD = bytes(range(256)) * 800
#: Where the PUBLISH starts in the wire of [CONNECT, SUBSCRIBE, PUBLISH] below, and its length.
_BIG_AT = len(encode(Connect("big"))) + len(encode(Subscribe(1, (("big/x", 2),))))
_BIG_LEN = len(encode(Publish("big/x", BIG_PAYLOAD, 1, packet_id=7)))
_EDGES = st.integers(-8, 8).map(lambda d: _BIG_AT + d) | st.integers(-8, 8).map(
    lambda d: _BIG_AT + _BIG_LEN + d
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cuts=st.lists(st.integers(1, _BIG_AT + _BIG_LEN - 1) | _EDGES, max_size=30),
    qos=st.sampled_from([0, 1, 2]),
    journal=st.booleans(),
)
async def test_a_large_publish_cut_anywhere_gives_the_same_output(
    cuts: list[int], qos: int, journal: bool
) -> None:
    """Issue 16: a ~200 KB PUBLISH cut at any offsets (its header and its end often among
    them) gives the same output as in one read: its acknowledgement and its delivery, whole."""
    sequence: list[Packet] = [
        Connect("big"),
        Subscribe(1, (("big/x", 2),)),
        Publish("big/x", BIG_PAYLOAD, qos, packet_id=7 if qos else None),
    ]
    whole, whole_closed = await _run_single(sequence, "whole", journal)
    cut, cut_closed = await _run_single(sequence, "cuts", journal, cuts)
    assert not whole_closed and not cut_closed
    assert sorted(map(repr, whole)) == sorted(map(repr, cut))
    delivered = [p for p in cut if isinstance(p, Publish)]
    assert [p.payload for p in delivered] == [BIG_PAYLOAD]


# -- 4: a malformed packet closes its connection only ------------------------------------------


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    subscriber=connects(client_ids=["sub"]).filter(lambda c: c.username is None),
    topic_filter=st.sampled_from(["a/b", "a/+", "a/#", "+/b", "#", "+/+"]),
    granted=qos_levels,
    # (3.1.1 only: some of MALFORMED are well-formed v5, e.g. a PUBACK with a reason code)
    bad=connects(client_ids=["bad", ""]).filter(
        lambda c: c.username is None and c.protocol_level != 5
    ),
    bad_packets=st.lists(session_packets, max_size=5),
    malformed=bad_input,
    split=st.booleans(),
    qos=qos_levels,
)
async def test_a_malformed_packet_closes_only_its_connection(
    subscriber: Connect,
    topic_filter: str,
    granted: int,
    bad: Connect,
    bad_packets: list[Packet],
    malformed: bytes,
    split: bool,
    qos: int,
) -> None:
    async with broker(journal=False, deny_subscribe=[]) as (world, errors):
        sub = world.connect()
        sub_packets: list[Packet] = [subscriber, Subscribe(1, ((topic_filter, granted),))]
        world.note_sent(sub, sub_packets)
        world.feed(sub, [sub.wire(sub_packets)])

        offender = world.connect()
        world.note_sent(offender, [bad, *bad_packets])
        data = b"".join(encode(p) for p in [bad, *bad_packets]) + malformed
        world.feed(offender, [data[i : i + 1] for i in range(len(data))] if split else [data])
        await settle(world)
        assert offender.link.closed and offender.link.lost

        publisher = world.connect()
        marker = b"after the offender"
        publish = Publish("a/b", marker, qos, packet_id=7 if qos else None)
        world.note_sent(publisher, [Connect("pub"), publish])
        world.feed(publisher, [encode(Connect("pub")) + encode(publish)])
        await settle(world)
        await acknowledge_all(world, sub)

        got = [
            p for p in sub.received() if isinstance(p, Publish | Publish5) and p.payload == marker
        ]
        assert len(got) == 1, sub.received()
        assert got[0].topic == "a/b" and got[0].qos == min(qos, granted)
        pub_out = publisher.received()
        assert pub_out[0] == Connack(0)
        if qos:
            assert pub_out[1:] == [Puback(7) if qos == 1 else Pubrec(7)]
        for client in world.live():
            client.link.shutdown("server_shutdown")
        await settle(world)
        check_end(world, errors)


# -- 2 (liveness): a paused publisher goes on, and every publish is acknowledged ---------------


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    journal=st.booleans(),
    granted=st.sampled_from([2, 0, 1, 2]),
    clean=st.booleans(),
    slow=st.booleans(),
    publishes_=st.lists(
        st.tuples(
            st.sampled_from(["a/b", "orders", "a/b"]),
            st.sampled_from([2, 0, 1, 2]),
            st.sampled_from([0, 400]),
        ),
        min_size=1,
        max_size=10,
    ),
    native_at=st.integers(0, 10),
    memory=st.sampled_from([300, 10**9]),
    byte_by_byte=st.booleans(),
    expire=st.booleans(),
)
async def test_a_paused_publisher_resumes_and_every_publish_is_acknowledged(
    journal: bool,
    granted: int,
    clean: bool,
    slow: bool,
    publishes_: list[tuple[str, int, int]],
    native_at: int,
    memory: int,
    byte_by_byte: bool,
    expire: bool,
) -> None:
    """A publisher paused for a slow subscriber (whose socket is full), for memory, or both,
    reads again once the subscriber drains (or the pause runs out) and memory is free; then
    every QoS 1/2 publish has its PUBACK/PUBREC, in the order of the publishes."""
    async with broker(journal=journal, memory=memory) as (world, errors):
        manager = world.server.manager
        sub, pub = world.connect(), world.connect()
        opening: list[Packet] = [Connect("sub", clean), Subscribe(1, (("a/b", granted),))]
        world.note_sent(sub, opening)
        world.feed(sub, [b"".join(encode(p) for p in opening)])
        world.note_sent(pub, [Connect("pub")])
        world.feed(pub, [encode(Connect("pub"))])
        await settle(world)
        if slow:
            sub.link.pause_writing()

        packets = [
            Publish(topic, b"x" * size, qos, packet_id=pid if qos else None)
            for pid, (topic, qos, size) in enumerate(publishes_, 1)
        ]
        for index, packet in enumerate(packets):
            if index == native_at:  # a VibeMQ client fills memory meanwhile
                manager.publish("orders", "native", b'"' + b"n" * 400 + b'"', {})
            data = encode(packet)
            world.feed(pub, [data[i : i + 1] for i in range(len(data))] if byte_by_byte else [data])
            await settle(world, 1)
        if expire:
            expire_holds(world)
            await settle(world)

        sub.link.resume_writing()
        manager.delete_queue("orders")
        manager.create_queue("orders")
        manager.memory_low = manager.memory_high = 10**12
        manager.tick()
        await quiesce(world)
        assert not pub.link.reading_paused and not pub.pending
        check_nothing_stuck(world)

        expected = [
            Puback(p.packet_id) if p.qos == 1 else Pubrec(p.packet_id)
            for p in packets
            if p.qos and p.packet_id
        ]
        assert pub.received() == [Connack(0), *expected]
        for client in world.live():
            client.link.shutdown("server_shutdown")
        await settle(world)
        check_end(world, errors)
