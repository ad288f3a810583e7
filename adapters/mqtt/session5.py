"""An MQTT 5.0 client session: the 3.1.1 session (session.py) with v5 PUBLISHes out.

What differs from 3.1.1 is what goes on the wire and a few limits the client set at CONNECT:

* every PUBLISH carries its application properties (``message5``), the Message Expiry
  Interval still left (a QoS 1/2 message in the session's queue has it as the core's TTL; one
  that expired is not sent), the subscription identifiers of the filters it matched, and a
  topic alias once the client allowed some (``Topic Alias Maximum``: the first
  ``alias_max_out`` topics sent get one, later PUBLISHes of them an empty topic);
* a PUBLISH larger than the client's ``Maximum Packet Size`` is not sent (section 3.1.2.11.4:
  discarded as if it had been delivered);
* the in-flight window is min(``mqtt.max_inflight``, the client's ``Receive Maximum``);
* the session lives on after its connection for the Session Expiry Interval (``expiry_s``,
  0xFFFFFFFF = never; the server ends it then), and the will may wait for its Will Delay
  Interval (``will_timer``: cancelled when the client is back first).

A message given in 3.1.1 form (retained messages, ``$SYS`` topics, other code that sends to
any session) is turned into v5 by adding an empty property block.
"""

from __future__ import annotations

from typing import Protocol

from vibemq_server.adapters.mqtt.codec import (
    MAX_PACKET_SIZE,
    decode_remaining_length,
    encode_remaining_length,
)
from vibemq_server.adapters.mqtt.codec5 import encode_publish5, property_block
from vibemq_server.adapters.mqtt.message5 import SUBSCRIPTION_IDS, header_entries
from vibemq_server.adapters.mqtt.packets5 import SubOptions
from vibemq_server.adapters.mqtt.session import (
    NO_ENTRIES,
    QOS,
    RETAIN,
    TOPIC,
    Holder,
    Link,
    MqttSession,
    SessionContext,
    SharedMember,
    own,
)
from vibemq_server.core import PublishOutcome, Queue, StoredMessage, Subscription

#: Session Expiry Interval meaning "never"
NEVER_EXPIRES = 0xFFFFFFFF
_U32_MAX = 0xFFFFFFFF


class Timer(Protocol):
    """What a session keeps of a pending will (``asyncio.TimerHandle`` is one)."""

    def cancel(self) -> None: ...


def _varint(value: int) -> bytes:
    return encode_remaining_length(value)


def v311_to_v5(packet: bytes) -> bytes:
    """A 3.1.1 PUBLISH as v5: the same with an empty property block after the packet id."""
    decoded = decode_remaining_length(packet, 1)
    assert decoded is not None
    length, size = decoded
    start = 1 + size
    topic_end = start + 2 + int.from_bytes(packet[start : start + 2], "big")
    if packet[0] & 0x06:
        topic_end += 2
    return b"".join(
        (
            packet[:1],
            encode_remaining_length(length + 1),
            packet[start:topic_end],
            b"\x00",
            packet[topic_end:],
        )
    )


class Mqtt5Session(MqttSession):
    """An MQTT 5.0 client's session."""

    v5 = True

    __slots__ = (
        "alias_max_out",
        "aliases_out",
        "expires_at",
        "expiry_s",
        "max_packet_out",
        "options5",
        "too_large",
        "will_timer",
    )

    def __init__(
        self,
        client_id: str,
        clean: bool,
        queue: Queue | None,
        context: SessionContext,
        max_inflight: int,
    ) -> None:
        # (the parameters spelled out: a compiled super().__init__(*args) passes them wrongly)
        super().__init__(client_id, clean, queue, context, max_inflight)
        #: topic filter -> (options, subscription identifier or 0)
        self.options5: dict[str, tuple[SubOptions, int]] = NO_ENTRIES
        #: Session Expiry Interval (s): 0 = ends with its connection
        self.expiry_s = 0
        #: when a detached session expires (the server's clock, s), None: not counting
        self.expires_at: float | None = None
        #: the client's Maximum Packet Size and Topic Alias Maximum (this connection's)
        self.max_packet_out = MAX_PACKET_SIZE
        self.alias_max_out = 0
        self.aliases_out: dict[str, int] = NO_ENTRIES
        self.will_timer: Timer | None = None
        #: messages not sent because they were over the client's Maximum Packet Size
        self.too_large = 0

    def attach(self, link: Link, holder: Holder) -> None:
        if self.will_timer is not None:
            self.will_timer.cancel()  # back before its will delay ran out: no will
            self.will_timer = None
        self.expires_at = None
        self.aliases_out = NO_ENTRIES
        super().attach(link, holder)

    # -- building a v5 PUBLISH -------------------------------------------------------------------

    def publish_bytes(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        pid: int,
        retain: bool,
        dup: bool,
        entries: bytes,
        expires_at: int,
        sub_ids: tuple[int, ...],
    ) -> bytes | None:
        """The PUBLISH for this client; None when it expired or is over the client's
        Maximum Packet Size (not sent then)."""
        if expires_at:
            left_ms = expires_at - self.manager.clock()
            if left_ms <= 0:
                return None
            entries += b"\x02" + min(-(-left_ms // 1000), _U32_MAX).to_bytes(4, "big")
        for sub_id in sub_ids:
            entries += b"\x0b" + _varint(sub_id)
        raw = self._topic_bytes(topic)
        alias = self.aliases_out.get(topic) if self.alias_max_out else None
        if alias is not None:
            packet = encode_publish5(
                b"",
                payload,
                qos,
                pid,
                _block(entries + b"\x23" + alias.to_bytes(2, "big")),
                retain=retain,
                dup=dup,
            )
        else:
            if self.alias_max_out and len(self.aliases_out) < self.alias_max_out:
                alias = len(self.aliases_out) + 1
                entries += b"\x23" + alias.to_bytes(2, "big")
            packet = encode_publish5(
                raw, payload, qos, pid, _block(entries), retain=retain, dup=dup
            )
            if alias is not None and len(packet) <= self.max_packet_out:
                self.aliases_out = own(self.aliases_out)
                self.aliases_out[topic] = alias
        if len(packet) > self.max_packet_out:
            self.too_large += 1
            return None
        return packet

    # -- QoS 0 -----------------------------------------------------------------------------------

    def send_qos0(self, packet: bytes) -> None:
        """A 3.1.1-form QoS 0 PUBLISH (retained, $SYS): sent as v5."""
        converted = v311_to_v5(packet)
        if len(converted) <= self.max_packet_out:
            MqttSession.send_qos0(self, converted)

    def send5_packet(self, packet: bytes) -> None:
        """A v5 QoS 0 PUBLISH built for several subscribers (no alias, expiry or ids)."""
        if len(packet) <= self.max_packet_out:
            MqttSession.send_qos0(self, packet)
        else:
            self.too_large += 1

    def send5(
        self,
        topic: str,
        payload: bytes,
        retain: bool,
        entries: bytes,
        expires_at: int,
        sub_ids: tuple[int, ...],
    ) -> None:
        if self.link is None:
            return
        if len(self._backlog) >= self.max_backlog:
            # Dropped by the backlog's bound: decided before building, so that no topic
            # alias is handed out in a PUBLISH that is never sent.
            self.dropped_qos0 += 1
            self._lost()
            return
        if expires_at or sub_ids or self.alias_max_out:
            packet = self.publish_bytes(
                topic, payload, 0, 0, retain, False, entries, expires_at, sub_ids
            )
            if packet is None:
                return
        else:  # (the usual: nothing per subscriber)
            packet = encode_publish5(
                self._topic_bytes(topic),
                payload,
                0,
                0,
                _block(entries) if entries else b"\x00",
                retain=retain,
            )
            if len(packet) > self.max_packet_out:
                self.too_large += 1
                return
        MqttSession.send_qos0(self, packet)

    # -- QoS 1/2 ---------------------------------------------------------------------------------

    def enqueue(self, topic: str, payload: bytes, qos: int, retain: bool = False) -> bool:
        return self.enqueue5(topic, payload, qos, retain, b"", 0, (), None)

    def enqueue5(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool,
        entries: bytes,
        expires_at: int,
        sub_ids: tuple[int, ...],
        headers5: dict[str, str] | None,
    ) -> bool:
        """A QoS 1/2 message for this client with its v5 parts (``headers5``: its
        properties as core headers, for the persistent queue); True when journaled."""
        if self.queue is None:
            pending = self._pending
            if not pending and self.writable:
                self._send_direct(topic, payload, qos, retain, entries, expires_at, sub_ids)
            elif len(pending) < self.max_backlog:
                self.add_pending((topic, payload, qos, retain, entries, expires_at, sub_ids))
            else:
                self.dropped_queued += 1
                self._lost()
            return False
        headers = dict(headers5) if headers5 else {}
        headers[TOPIC] = topic
        headers[QOS] = "2" if qos == 2 else "1"
        if retain:
            headers[RETAIN] = "1"
        if sub_ids:
            headers[SUBSCRIPTION_IDS] = ",".join(map(str, sub_ids))
        ttl_ms = 0
        if expires_at:
            ttl_ms = max(1, expires_at - self.manager.clock())
        outcome = self.manager.publish(
            self.queue.name, self._ctx.next_msg_id(), payload, headers, route=False, ttl_ms=ttl_ms
        )
        if not outcome.accepted:
            self.dropped_queued += 1
            return False
        return outcome is PublishOutcome.ACCEPTED_DURABLE

    def _send_direct(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool,
        entries: bytes = b"",
        expires_at: int = 0,
        sub_ids: tuple[int, ...] = (),
    ) -> None:
        assert self.link is not None
        pid = self._allocate()
        if expires_at or sub_ids or self.alias_max_out:
            packet = self.publish_bytes(
                topic, payload, qos, pid, retain, False, entries, expires_at, sub_ids
            )
        else:  # (the usual: nothing per subscriber)
            packet = encode_publish5(
                self._topic_bytes(topic),
                payload,
                qos,
                pid,
                _block(entries) if entries else b"\x00",
                retain=retain,
            )
            if len(packet) > self.max_packet_out:
                self.too_large += 1
                packet = None
        if packet is None:
            self._used.discard(pid)
            return
        self.direct = own(self.direct)
        self.direct[pid] = qos
        self.stats.messages_sent += 1
        self.link.send(packet)

    def deliver(self, sub: Subscription, msg: StoredMessage) -> None:
        """A message of the persistent session's queue."""
        link = self.link
        if link is None:
            return
        headers = msg.headers
        pid = self.packet_ids.get(msg.id)
        if pid is None:
            pid = self._allocate()
            self.packet_ids = own(self.packet_ids)
            self.packet_ids[msg.id] = pid
        ids = headers.get(SUBSCRIPTION_IDS)
        sub_ids = tuple(int(i) for i in ids.split(",")) if ids else ()
        packet = self.publish_bytes(
            headers[TOPIC],
            msg.payload,
            2 if headers.get(QOS) == "2" else 1,
            pid,
            RETAIN in headers,
            msg.attempts > 1,
            header_entries(headers),
            msg.expires_at,
            sub_ids,
        )
        if packet is None:
            # Over the client's maximum size: as if delivered (section 3.1.2.11.4).
            self.packet_ids.pop(msg.id, None)
            self._used.discard(pid)
            self.manager.ack(sub, msg.id, dispatch=False)
            return
        self.outbound = own(self.outbound)
        self.outbound[pid] = msg
        self.stats.messages_sent += 1
        link.send(packet)

    def direct_packet(
        self, member: SharedMember, topic: str, payload: bytes, qos: int, pid: int
    ) -> bytes | None:
        if member.sub_id or len(self.shared) > 1:
            ids = tuple(
                m.sub_id
                for m in self.shared.values()
                if m.sub is not None and m.queue_name == member.queue_name and m.sub_id
            )
        else:
            ids = ()
        if ids or self.alias_max_out:
            return self.publish_bytes(topic, payload, qos, pid, False, False, b"", 0, ids)
        packet = encode_publish5(self._topic_bytes(topic), payload, qos, pid, b"\x00")
        if len(packet) > self.max_packet_out:
            self.too_large += 1
            return None
        return packet

    def shared_packet(
        self, topic: str, payload: bytes, qos: int, pid: int, msg: StoredMessage
    ) -> bytes:
        member_ids = tuple(
            m.sub_id
            for m in self.shared.values()
            if m.sub is not None and m.sub.queue.name == msg.queue and m.sub_id
        )
        packet = self.publish_bytes(
            topic,
            payload,
            qos,
            pid,
            False,
            msg.attempts > 1,
            header_entries(msg.headers),
            msg.expires_at,
            member_ids,
        )
        # Over the client's maximum: an empty-bodied stand-in is not possible, so the
        # message goes out without its properties (still within the broker's own limit).
        return packet if packet is not None else v311_to_v5_publish(topic, payload, qos, pid)


_block = property_block


def v311_to_v5_publish(topic: str, payload: bytes, qos: int, pid: int) -> bytes:
    return encode_publish5(topic.encode(), payload, qos, pid, b"\x00")
