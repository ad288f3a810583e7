"""MQTT sessions and retained messages as an operator sees them: list, detail, end a
session (disconnecting its client), list and clear retained messages.

The MQTT adapter keeps both (its session registry, the ``$mqtt.retained`` table); this layer
reaches them through Protocols it declares and the adapter's ``MqttServer`` implements
(``MqttState``, ``MqttSessionState``): no adapter is imported. Ending a session or clearing a
retained message goes through the adapter's own methods, so the journal's records go as
they do when a client does it. Synchronous, called from the broker's event loop.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from vibemq_server.core import Queue, StoredMessage
from vibemq_server.core.manager import iso_ms
from vibemq_server.management.errors import Invalid, NotFound
from vibemq_server.server.broker import Broker

#: the reason the client of an ended session is given in the log (MQTT 3.1.1 has no server
#: DISCONNECT: its socket just closes)
DEFAULT_END_REASON = "session ended via management API"
_QOS_HEADER = "mqttQos"


@runtime_checkable
class MqttSessionState(Protocol):
    """What is shown of one MQTT session (``MqttSession``)."""

    @property
    def client_id(self) -> str: ...
    @property
    def clean(self) -> bool: ...
    @property
    def connected(self) -> bool: ...
    @property
    def user(self) -> str | None: ...
    @property
    def filters(self) -> Mapping[str, int]: ...
    @property
    def queue(self) -> Queue | None: ...
    @property
    def queued(self) -> int: ...
    @property
    def inflight(self) -> int: ...
    @property
    def connection_id(self) -> str | None: ...
    @property
    def dropped_qos0(self) -> int: ...
    @property
    def dropped_queued(self) -> int: ...


@runtime_checkable
class MqttState(Protocol):
    """What this module uses of the MQTT adapter (``MqttServer``), when it runs."""

    def client_sessions(self) -> Mapping[str, MqttSessionState]:
        """Every session, and every clean client connected without one yet."""
        ...

    def client_session(self, client_id: str) -> MqttSessionState | None: ...

    def end_session_by_operator(self, client_id: str, reason: str) -> bool: ...

    def retained_messages(
        self, topic_filter: str | None = None
    ) -> list[tuple[str, StoredMessage]]: ...

    def clear_retained(self, topic: str) -> bool: ...


class _Camel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, validate_by_name=True, extra="forbid")


class SessionFilter(_Camel):
    filter: str
    qos: int


class MqttSessionOut(_Camel):
    client_id: str
    clean: bool = Field(description="clean session: it ends with its connection")
    connected: bool
    user: str | None = Field(
        description="who its last connection logged in as (None after a restart until then)"
    )
    connection: str | None = Field(description="the connection holding it (/api/connections)")
    filters: list[SessionFilter] = Field(description="its subscriptions, with the granted QoS")
    queued_messages: int = Field(description="QoS 1/2 messages waiting for the client")
    inflight: int = Field(description="sent, not acknowledged yet")
    queue: str | None = Field(description="a persistent session's durable queue")
    dropped: int = Field(description="messages dropped by the session's bounds")


class SessionPage(_Camel):
    items: list[MqttSessionOut]
    page: int
    page_size: int
    total: int
    pages: int


PayloadEncoding = Literal["json", "text", "base64"]


class RetainedOut(_Camel):
    topic: str
    payload: Any = Field(description="JSON when the bytes are JSON, else text, else base64")
    payload_encoding: PayloadEncoding
    size: int = Field(description="bytes")
    qos: int
    stored_at: str


class RetainedPage(_Camel):
    items: list[RetainedOut]
    page: int
    page_size: int
    total: int
    pages: int


def mqtt_state(broker: Broker) -> MqttState:
    """The MQTT adapter; NotFound when MQTT is off."""
    adapter = broker.adapters.get("mqtt")
    if not isinstance(adapter, MqttState):
        raise NotFound("MQTT is off on this broker")
    return adapter


def _session_out(session: MqttSessionState) -> MqttSessionOut:
    return MqttSessionOut(
        client_id=session.client_id,
        clean=session.clean,
        connected=session.connected,
        user=session.user,
        connection=session.connection_id,
        filters=[SessionFilter(filter=f, qos=q) for f, q in sorted(session.filters.items())],
        queued_messages=session.queued,
        inflight=session.inflight,
        queue=session.queue.name if session.queue is not None else None,
        dropped=session.dropped_qos0 + session.dropped_queued,
    )


def _pages(total: int, page_size: int) -> int:
    return max(1, math.ceil(total / page_size))


def list_sessions(
    broker: Broker,
    *,
    page: int = 1,
    page_size: int = 100,
    client_id: str | None = None,
    connected: bool | None = None,
) -> SessionPage:
    """A page of sessions by client id; ``client_id`` a substring, ``connected`` only the
    sessions whose client is (or is not) connected."""
    sessions = [
        s
        for s in mqtt_state(broker).client_sessions().values()
        if (client_id is None or client_id in s.client_id)
        and (connected is None or s.connected == connected)
    ]
    sessions.sort(key=lambda s: s.client_id)
    start = (page - 1) * page_size
    return SessionPage(
        items=[_session_out(s) for s in sessions[start : start + page_size]],
        page=page,
        page_size=page_size,
        total=len(sessions),
        pages=_pages(len(sessions), page_size),
    )


def get_session(broker: Broker, client_id: str) -> MqttSessionOut:
    session = mqtt_state(broker).client_session(client_id)
    if session is None:
        raise NotFound(f"no MQTT session {client_id!r}")
    return _session_out(session)


def end_session(broker: Broker, client_id: str, reason: str = DEFAULT_END_REASON) -> MqttSessionOut:
    """End a session, persistent or not: its client (if connected) is disconnected without
    its will, its subscriptions and queued messages are dropped. Returns it as it was."""
    state = mqtt_state(broker)
    session = state.client_session(client_id)
    if session is None:
        raise NotFound(f"no MQTT session {client_id!r}")
    before = _session_out(session)
    state.end_session_by_operator(client_id, reason)
    return before


def _payload(raw: bytes) -> tuple[Any, PayloadEncoding]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return base64.b64encode(raw).decode("ascii"), "base64"
    try:
        return json.loads(text), "json"
    except ValueError:
        return text, "text"


def _retained_out(topic: str, msg: StoredMessage) -> RetainedOut:
    payload, encoding = _payload(msg.payload)
    return RetainedOut(
        topic=topic,
        payload=payload,
        payload_encoding=encoding,
        size=len(msg.payload),
        qos=int(msg.headers.get(_QOS_HEADER, "0")),
        stored_at=iso_ms(msg.published_at),
    )


def list_retained(
    broker: Broker, topic_filter: str | None = None, *, page: int = 1, page_size: int = 100
) -> RetainedPage:
    """A page of retained messages by topic, of the topics ``topic_filter`` (an MQTT
    filter: ``sensors/+/temp``, ``#``) matches; Invalid for a filter that is not one."""
    try:
        found = mqtt_state(broker).retained_messages(topic_filter)
    except ValueError as exc:
        raise Invalid(str(exc), "filter") from None
    start = (page - 1) * page_size
    return RetainedPage(
        items=[_retained_out(t, m) for t, m in found[start : start + page_size]],
        page=page,
        page_size=page_size,
        total=len(found),
        pages=_pages(len(found), page_size),
    )


def clear_retained(broker: Broker, topic: str) -> None:
    """Forget a topic's retained message (as a retained PUBLISH with no payload does)."""
    if not mqtt_state(broker).clear_retained(topic):
        raise NotFound(f"no retained message on topic {topic!r}")
