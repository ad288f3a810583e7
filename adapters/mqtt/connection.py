"""One MQTT connection: the asyncio transport and the protocol state machine.

States and the packets each accepts are in ``_ACCEPTS``; the handler of each packet type is in
``_HANDLERS``. Anything else (a packet before CONNECT, a second CONNECT, a server-to-client
packet, any malformed input) closes the connection with a log line, as 3.1.1 requires; the
will is published then, as on every close not preceded by DISCONNECT.

Transport rules as for the VibeMQ protocol: every complete packet of a read is handled in one
pass, output is written once per loop tick, a paused socket makes deliveries wait in the
session's queue, and publishers are paused while the broker is over its memory bound.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, cast

import structlog

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
from vibemq_server.server.transport import BufferedConnection

if TYPE_CHECKING:
    from vibemq_server.adapters.mqtt.server import MqttServer
    from vibemq_server.adapters.mqtt.session import MqttSession

_ids = itertools.count(1)
_PINGRESP = encode(Pingresp())


class State(Enum):
    AWAIT_CONNECT = "await_connect"
    CONNECTED = "connected"
    CLOSED = "closed"


#: What each state accepts from the client; a packet not listed closes the connection.
_ACCEPTS: dict[State, frozenset[type]] = {
    State.AWAIT_CONNECT: frozenset({Connect}),
    State.CONNECTED: frozenset(
        {Publish, Puback, Pubrec, Pubrel, Pubcomp, Subscribe, Unsubscribe, Pingreq, Disconnect}
    ),
    State.CLOSED: frozenset(),
}


class MqttConnection(BufferedConnection):
    def __init__(self, server: MqttServer) -> None:
        self.server = server
        self.manager = server.manager
        self._init_buffers(
            asyncio.get_running_loop(), server.config.write_buffer_high_bytes, server.batch
        )
        self.conn_id = f"mqtt_{next(_ids)}"
        self.parser = MqttParser(server.cfg.max_packet_size)
        self._state = State.AWAIT_CONNECT
        self._accepts = _ACCEPTS[State.AWAIT_CONNECT]
        self.session: MqttSession | None = None
        self.will: Connect | None = None
        self.keep_alive = 0.0
        self.opened_at = self.loop.time()
        self.last_rx = self.opened_at
        self.partial_since: float | None = None
        self._acked_any = False
        # Packets not yet handled while a subscriber drains (see _process).
        self._held: tuple[list[Packet], int] | None = None
        self._held_error: MqttProtocolError | None = None
        self._published = False  # this read published something (memory alarm)
        self._holds = 0
        self._hold_gen = 0
        self._hold_timer: asyncio.TimerHandle | None = None
        self._held_sessions: list[MqttSession] = []
        # Acknowledgements that wait for the journal, keyed by its flush epoch.
        self._durable_batch: list[bytes] | None = None
        self._durable_epoch = -1
        self._durable_pending = 0
        self.log: structlog.typing.FilteringBoundLogger = structlog.get_logger("vibemq.mqtt")

    @property
    def state(self) -> State:
        return self._state

    @state.setter
    def state(self, state: State) -> None:
        # The hot path reads the accepted packet types directly (no Enum hashing per packet).
        self._state = state
        self._accepts = _ACCEPTS[state]

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._accept(transport, lambda: self.server.register(self)):
            self.state = State.CLOSED

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        self.last_rx = self.loop.time()
        error: MqttProtocolError | None = None
        try:
            packets = self.parser.feed(data)
        except MqttProtocolError as exc:
            packets = list(exc.packets)
            error = exc
        reads = self.server.batch
        reads.begin()
        try:
            if self._process(packets, 0):
                self._after_read(bool(packets), error)
            else:
                self._held_error = error
        finally:
            reads.end()

    def _process(self, packets: list[Packet], start: int) -> bool:
        """Handle ``packets[start:]``. False when a publish found a subscriber's socket
        backed up: the rest waits (reading paused) until that subscriber has drained."""
        server = self.server
        for index in range(start, len(packets)):
            accepts = self._accepts
            if not accepts:
                break  # closed
            packet = packets[index]
            if type(packet) not in accepts:
                self._violation(
                    f"{type(packet).__name__.upper()} not allowed in {self.state.value}"
                )
                break
            _HANDLERS[type(packet)](self, packet)
            if server.congested:
                self._hold(packets, index + 1)
                return False
        return True

    def _after_read(self, progressed: bool, error: MqttProtocolError | None) -> None:
        if self._acked_any:
            self._acked_any = False
            if self.session is not None:
                self.session.refill()
        if error is not None and self.state in _RUNNING:
            self._malformed(error)
            return
        if self.parser.buffered:
            if progressed or self.partial_since is None:
                self.partial_since = self.last_rx
        else:
            self.partial_since = None
        # Over the memory high watermark only connections that publish stop being read: a
        # subscriber's PUBACKs are what frees memory, so pausing it would never end.
        published, self._published = self._published, False
        if self.manager.memory_blocked and not self._reading_paused and published:
            self.log.info("publisher paused: memory high watermark")
            self.pause_reading()
            self.manager.wait_for_memory(self.resume_reading)

    def _hold(self, packets: list[Packet], rest: int) -> None:
        sessions, self.server.congested = self.server.congested, []
        self._held = (packets, rest)
        self._holds = len(sessions)
        self.pause_reading()
        # Bounded: publishers and subscribers that wait on each other must not deadlock;
        # after this, messages beyond a session's bound are dropped as configured.
        self._held_sessions = sessions
        self._hold_timer = self.loop.call_later(
            self.server.cfg.max_publisher_pause_s, self._hold_expired
        )
        self._hold_gen += 1
        gen = self._hold_gen
        for session in sessions:
            session.when_drained(lambda: self._drained(gen))

    def _drained(self, gen: int) -> None:
        if gen != self._hold_gen or self._held is None:
            return  # a hold that already ended (timed out)
        self._holds -= 1
        if self._holds > 0:
            return
        # Called from inside a session's flush: carry on in a loop callback of our own.
        self.loop.call_soon(self._resume_held)

    def _hold_expired(self) -> None:
        self._hold_timer = None
        for session in self._held_sessions:
            if session.congested and not session.stalled:
                session.stalled = True
                self.log.info(
                    "subscriber not keeping up; publishers go on", client=session.client_id
                )
        self._resume_held()

    def _resume_held(self) -> None:
        self._held_sessions = []
        if self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = None
        held, self._held = self._held, None
        if held is None or self._closing:
            return
        packets, rest = held
        if self._process(packets, rest):
            error, self._held_error = self._held_error, None
            self._after_read(True, error)
            if not self._reading_paused_for_memory():
                self.resume_reading()
            else:  # still paused (by the hold): go on once memory is free
                self.manager.wait_for_memory(self.resume_reading)

    def _reading_paused_for_memory(self) -> bool:
        return self.manager.memory_blocked

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        abnormal = self.state is not State.CLOSED
        self.state = State.CLOSED
        self.server.unregister(self)
        self._end(publish_will=abnormal)
        self.log.debug("connection closed", error=str(exc) if exc else None)

    # -- BufferedConnection hooks -------------------------------------------------------------

    def _writable_again(self) -> None:
        session = self.session
        if session is not None and session.link is self:
            session.on_writable()

    def _drop(self, reason: str) -> None:
        """Close because of the client (violation, silence, takeover): the will goes out."""
        if self.state is State.CLOSED:
            return
        self.state = State.CLOSED
        self._end(publish_will=True)
        self.log.info("connection dropped", reason=reason)
        self.close()

    def _violation(self, reason: str) -> None:
        self.log.warning("protocol violation", reason=reason)
        self._drop("protocol_violation")

    def _malformed(self, exc: MqttProtocolError) -> None:
        self.log.warning("malformed packet", code=exc.code.value, error=exc.message)
        connack = exc.code.connack_code
        if connack is not None and self.state is State.AWAIT_CONNECT:
            self.send(encode(Connack(connack)))
        self._drop("malformed_packet")

    def _end(self, publish_will: bool) -> None:
        """Leave the session (kept or forgotten) and publish the will if it is due."""
        session, self.session = self.session, None
        will, self.will = self.will, None
        if session is not None and session.link is self:
            if session.clean:
                self.server.end_session(session)
            else:
                session.detach()
        if publish_will and will is not None and will.will_topic is not None:
            if self.server.publish_denied(will.will_topic):
                # deny_publish covers wills too, or a will would be a way around it.
                self.log.debug("will denied", topic=will.will_topic)
                return
            self.log.debug("publishing will", topic=will.will_topic)
            self.server.route(
                will.will_topic, will.will_payload, will.will_qos, will.will_retain, pause=False
            )

    def taken_over(self) -> None:
        """Another connection CONNECTed with our client id: it gets the session."""
        self.log.info("session taken over by a new connection")
        self._drop("session_taken_over")

    def shutdown(self, reason: str) -> None:
        """Broker shutdown: MQTT 3.1.1 has no server DISCONNECT, so just close (no will)."""
        self.state = State.CLOSED
        session, self.session = self.session, None
        self.will = None
        if session is not None and session.link is self:
            if session.clean:
                self.server.end_session(session)
            else:
                session.detach()
        self.close()

    def check_timers(self, now: float, keepalive: float, frame_timeout: float) -> None:
        """Keep-alive (1.5 x the client's), the CONNECT deadline and stalled packets."""
        if self._closing or self.state is State.CLOSED:
            return
        if self._reading_paused:
            self.last_rx = now
            return
        if self.state is State.AWAIT_CONNECT:
            if now - self.opened_at > self.server.cfg.connect_timeout_s:
                self.log.info("no CONNECT in time")
                self._drop("connect_timeout")
            return
        if self.partial_since is not None and now - self.partial_since > frame_timeout:
            self.log.warning("incomplete packet timed out", buffered=self.parser.buffered)
            self._drop("packet_timeout")
        elif self.keep_alive and now - self.last_rx > self.keep_alive * 1.5:
            self.log.info("keep-alive timeout", idle_s=round(now - self.last_rx, 1))
            self._drop("keepalive_timeout")

    # -- packet handlers ---------------------------------------------------------------------

    def on_connect(self, packet: Connect) -> None:
        server = self.server
        code = server.authenticate(packet)
        client_id = packet.client_id
        if code is ConnackCode.ACCEPTED and len(client_id) > server.cfg.max_client_id_length:
            code = ConnackCode.IDENTIFIER_REJECTED
        if code is not ConnackCode.ACCEPTED:
            self.log.warning("connect refused", code=code.name, client_id=client_id)
            self.send(encode(Connack(code)))
            self.state = State.CLOSED
            self.close()
            return
        if not client_id:
            client_id = f"auto-{uuid.uuid4().hex}"
        old = server.sessions.get(client_id)
        if old is not None and old.link is not None:
            cast(MqttConnection, old.link).taken_over()
        session, resumed = server.open_session(client_id, packet.clean_session)
        self.log = self.log.bind(client_id=client_id)
        self.session = session
        self.will = packet if packet.has_will else None
        self.keep_alive = float(packet.keep_alive)
        self.state = State.CONNECTED
        present = resumed and packet.protocol_level == PROTOCOL_LEVEL_V311
        self.send(encode(Connack(ConnackCode.ACCEPTED, present)))
        session.attach(self)
        session.start_delivery()
        self.log.debug("connected", clean=packet.clean_session, resumed=resumed)

    def on_publish(self, packet: Publish) -> None:
        self._published = True
        session = self.session
        assert session is not None
        qos = packet.qos
        pid = packet.packet_id or 0
        if qos == 2 and pid in session.inbound_qos2:
            self._acknowledge(b"\x50\x02" + pid.to_bytes(2, "big"), durable=False)
            return  # a resent QoS 2 PUBLISH: routed already, exactly once
        if self.server.publish_denied(packet.topic):
            self.log.debug("publish denied", topic=packet.topic)
            durable = False
        else:
            durable = self.server.route(packet.topic, packet.payload, qos, packet.retain, session)
        if qos == 1:
            self._acknowledge(b"\x40\x02" + pid.to_bytes(2, "big"), durable)
        elif qos == 2:
            session.inbound_qos2.add(pid)
            self._acknowledge(b"\x50\x02" + pid.to_bytes(2, "big"), durable)

    def _acknowledge(self, packet: bytes, durable: bool) -> None:
        """PUBACK / PUBREC / PUBCOMP now, or once the journal has what the publish stored;
        either way in the order the publishes came (3.1.1 section 4.6)."""
        persistence = self.manager.persistence
        if durable and persistence is not None:
            if self._durable_batch is None or self._durable_epoch != persistence.epoch:
                batch: list[bytes] = []
                self._durable_batch = batch
                self._durable_epoch = persistence.epoch
                self._durable_pending += 1
                persistence.when_durable(lambda err: self._durable_done(batch, err))
            self._durable_batch.append(packet)
        elif self._durable_pending and self._durable_batch is not None:
            self._durable_batch.append(packet)  # behind an acknowledgement still waiting
        else:
            self.send(packet)

    def _durable_done(self, batch: list[bytes], err: Exception | None) -> None:
        self._durable_pending -= 1
        if batch is self._durable_batch:
            self._durable_batch = None
        if self.state is State.CLOSED or self._closing:
            return
        if err is not None:
            # MQTT 3.1.1 cannot say "not stored": withholding the acknowledgement and
            # closing makes the client send the message again.
            self.log.error("journal write failed; closing so the client resends", error=str(err))
            self._drop("storage_failure")
            return
        self.send(b"".join(batch))

    def on_puback(self, packet: Puback) -> None:
        assert self.session is not None
        if self.session.puback(packet.packet_id):
            self._acked_any = True

    def on_pubrec(self, packet: Pubrec) -> None:
        assert self.session is not None
        self.session.pubrec(packet.packet_id)
        self._acked_any = True
        self.send(b"\x62\x02" + packet.packet_id.to_bytes(2, "big"))

    def on_pubrel(self, packet: Pubrel) -> None:
        assert self.session is not None
        self.session.inbound_qos2.discard(packet.packet_id)
        self._acknowledge(b"\x70\x02" + packet.packet_id.to_bytes(2, "big"), durable=False)

    def on_pubcomp(self, packet: Pubcomp) -> None:
        assert self.session is not None
        self.session.pubcomp(packet.packet_id)
        self._acked_any = True  # a packet id came free: the window may take the next message

    def on_subscribe(self, packet: Subscribe) -> None:
        session = self.session
        assert session is not None
        server = self.server
        codes = tuple(server.subscribe(session, f, q) for f, q in packet.subscriptions)
        server.save_session(session)
        self.send(encode(Suback(packet.packet_id, codes)))
        for (topic_filter, _), granted in zip(packet.subscriptions, codes, strict=True):
            if granted != 0x80:
                server.send_retained(session, topic_filter, granted)
            else:
                self.log.info("subscription refused", filter=topic_filter)

    def on_unsubscribe(self, packet: Unsubscribe) -> None:
        session = self.session
        assert session is not None
        for topic_filter in packet.topic_filters:
            self.server.unsubscribe(session, topic_filter)
        self.server.save_session(session)
        self.send(encode(Unsuback(packet.packet_id)))

    def on_pingreq(self, packet: Pingreq) -> None:
        self.send(_PINGRESP)

    def on_disconnect(self, packet: Disconnect) -> None:
        self.state = State.CLOSED
        self._end(publish_will=False)
        self.close()


_RUNNING = frozenset({State.AWAIT_CONNECT, State.CONNECTED})

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
