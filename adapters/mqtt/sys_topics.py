"""The ``$SYS/broker/...`` topics, as Mosquitto publishes them, every ``mqtt.sys_interval_s``.

Each value is kept as a retained message (in memory only: it is rebuilt at start, so it is
never journaled nor counted against ``mqtt.max_retained``) and published, when it changed, to
the MQTT sessions whose filters match, at QoS 0 like Mosquitto. Topics starting with ``$``
are never matched by a filter whose first level is a wildcard (3.1.1 section 4.7.2): ``#``
and ``+/...`` get none of this, ``$SYS/#`` gets all of it. The values only go to MQTT
sessions, not through the core: no other protocol has ``$SYS``.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping, Sized
from typing import Protocol

from vibemq_server.adapters.mqtt.codec import encode_publish
from vibemq_server.adapters.mqtt.session import MqttSession
from vibemq_server.adapters.mqtt.topics import matches, topic_to_address
from vibemq_server.core.topics import TopicRouter
from vibemq_server.server.stats import BrokerStats, ProtocolStats

SYS_PREFIX = "$SYS/"

#: The load averages' windows (Mosquitto's $SYS/broker/load/.../1min, 5min, 15min), seconds.
LOAD_WINDOWS = ((60.0, "1min"), (300.0, "5min"), (900.0, "15min"))
#: What the load averages follow: the ProtocolStats counter behind each topic.
LOAD_COUNTERS = (
    ("messages/received", "messages_received"),
    ("messages/sent", "messages_sent"),
    ("bytes/received", "bytes_received"),
    ("bytes/sent", "bytes_sent"),
)


class Server(Protocol):
    """What the $SYS publisher reads of the MQTT server (``server.MqttServer``)."""

    broker_stats: BrokerStats
    stats: ProtocolStats
    router: TopicRouter[MqttSession]
    #: MQTT 5 subscriptions, keyed by (session, filter)
    router5: TopicRouter[tuple[MqttSession, str]]

    @property
    def retained(self) -> Sized | None: ...

    @property
    def sessions(self) -> Mapping[str, MqttSession]: ...

    @property
    def sessionless(self) -> Mapping[str, object]: ...


RETAINED_COUNT = "$SYS/broker/retained messages/count"


def _values(server: Server) -> dict[str, str]:
    """Every $SYS topic and its value now (Mosquitto's names and formats)."""
    stats = server.stats
    broker = server.broker_stats
    sessions = server.sessions.values()
    # (clean clients without a session yet: connected, each an empty session)
    sessionless = len(server.sessionless)
    connected = sum(1 for s in sessions if s.connected) + sessionless
    retained = len(server.retained) if server.retained is not None else 0
    return {
        "$SYS/broker/version": f"VibeMQ version {broker.version}",
        "$SYS/broker/uptime": f"{int(broker.uptime_s)} seconds",
        "$SYS/broker/clients/connected": str(connected),
        "$SYS/broker/clients/disconnected": str(len(sessions) + sessionless - connected),
        "$SYS/broker/clients/total": str(len(sessions) + sessionless),
        "$SYS/broker/messages/received": str(stats.messages_received),
        "$SYS/broker/messages/sent": str(stats.messages_sent),
        "$SYS/broker/publish/messages/dropped": str(stats.messages_dropped),
        "$SYS/broker/bytes/received": str(stats.bytes_received),
        "$SYS/broker/bytes/sent": str(stats.bytes_sent),
        "$SYS/broker/subscriptions/count": str(sum(len(s.filters) for s in sessions)),
        # the retained messages, these $SYS ones included (counted in publish())
        RETAINED_COUNT: str(retained),
    }


class Loads:
    """Per-minute rates of the MQTT counters, as exponentially-decaying moving averages over
    1, 5 and 15 minutes (what Mosquitto's ``$SYS/broker/load/...`` topics show)."""

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self._now = now
        self._at: float | None = None
        self._last: dict[str, int] = {}
        self.values: dict[str, float] = {
            f"$SYS/broker/load/{topic}/{label}": 0.0
            for topic, _ in LOAD_COUNTERS
            for _, label in LOAD_WINDOWS
        }

    def update(self, stats: ProtocolStats) -> None:
        now = self._now()
        at, self._at = self._at, now
        for topic, field in LOAD_COUNTERS:
            count: int = getattr(stats, field)
            last = self._last.get(topic)
            self._last[topic] = count
            if at is None or last is None or now <= at:
                continue
            elapsed = now - at
            per_minute = (count - last) * 60.0 / elapsed
            for window, label in LOAD_WINDOWS:
                key = f"$SYS/broker/load/{topic}/{label}"
                keep = math.exp(-elapsed / window)
                self.values[key] = self.values[key] * keep + per_minute * (1.0 - keep)


class SysTopics:
    """The $SYS values of one MQTT server, and the timer that publishes them."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.loads = Loads()
        #: topic -> its latest value (what a new $SYS subscriber gets, RETAIN set)
        self.retained: dict[str, bytes] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._call_later: Callable[[float, Callable[[], None]], asyncio.TimerHandle] | None = None
        self._interval = 0.0

    def start(self, loop: asyncio.AbstractEventLoop, interval_s: float) -> None:
        """Publish now, then every ``interval_s`` (0: never)."""
        if interval_s <= 0:
            return
        self._interval = interval_s
        self._call_later = loop.call_later
        self._tick()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._call_later = None

    def _tick(self) -> None:
        self.publish()
        if self._call_later is not None:
            self._timer = self._call_later(self._interval, self._tick)

    def publish(self) -> None:
        """Publish the values that changed since the last time (all of them the first time)."""
        retained = self.retained
        router = self.server.router
        router5 = self.server.router5
        self.loads.update(self.server.stats)
        values = _values(self.server)
        values.update((topic, f"{load:.2f}") for topic, load in self.loads.values.items())
        values[RETAINED_COUNT] = str(int(values[RETAINED_COUNT]) + len(values))
        for topic, text in values.items():
            value = text.encode()
            if retained.get(topic) == value:
                continue
            retained[topic] = value
            address = topic_to_address(topic)
            targets = router.match(address)
            # (a v5 session turns the 3.1.1 PUBLISH into its own form, once per session)
            targets5 = {session for session, _ in router5.match(address)} if router5 else ()
            if targets or targets5:
                packet = encode_publish(topic.encode(), value)
                for session in (*targets, *targets5):
                    session.send_qos0(packet)

    def send_retained(self, session: MqttSession, topic_filter: str) -> None:
        """A new subscription's share of the $SYS values, RETAIN set, at QoS 0."""
        for topic, value in self.retained.items():
            if matches(topic_filter, topic):
                session.send_qos0(encode_publish(topic.encode(), value, 0, retain=True))
