"""Connections as an operator sees them: list, detail, close; and the consumers of queues.

Every stream connection of every protocol (native VibeMQ, MQTT, AMQP) is in the broker's
connection registry (``Broker.connections``): its transport knows the socket side (peer, TLS,
when, bytes), its session describes the protocol side (``Session.describe``: user, client id,
consumers). ZeroMQ peers are libzmq's and not listed. Synchronous, called from the broker's
event loop.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import structlog
from pydantic import BaseModel, Field

from vibemq_server.server.broker import Broker
from vibemq_server.server.transport import ConsumerInfo, Detail, SessionInfo, StreamTransport

log = structlog.get_logger("vibemq.management")

#: the reason a client is told when the operator gives none (RabbitMQ's management plugin
#: says "Closed via management plugin")
DEFAULT_CLOSE_REASON = "Closed via management API"


class ConnectionNotFound(LookupError):
    """No connection with that id (it may have closed meanwhile)."""


class Consumer(BaseModel):
    """One consumer: a subscription (native), basic.consume (AMQP), a session queue (MQTT)."""

    queue: str
    tag: str = Field(description="subscription id (native), consumer tag (AMQP), client id (MQTT)")
    prefetch: int = Field(description="deliveries unacknowledged at most; 0 = no limit")
    unacked: int
    channel: int | None = Field(None, description="AMQP channel number")
    connection: str
    protocol: str
    user: str | None


class Connection(BaseModel):
    """One client connection, whatever its protocol."""

    id: str
    protocol: str = Field(description="vibemq, mqtt, amqp ('' while a TLS handshake runs)")
    user: str | None = Field(description="who it logged in as; None: not yet")
    client_id: str | None = Field(
        description="MQTT client id, native clientVersion, AMQP product / connection_name"
    )
    state: str
    peer_host: str
    peer_port: int
    tls: bool
    tls_identity: str | None = Field(description="a verified client certificate's CN")
    connected_at: dt.datetime
    bytes_in: int = Field(description="protocol bytes received (after TLS decryption)")
    bytes_out: int = Field(description="protocol bytes sent (before TLS encryption)")
    messages_in: int | None = Field(None, description="not counted per connection (None)")
    messages_out: int | None = Field(None, description="not counted per connection (None)")
    channels: int
    consumers: int
    subscriptions: int = Field(description="address subscriptions (MQTT topic filters)")


class ConnectionDetail(Connection):
    consumer_list: list[Consumer]
    subscription_list: dict[str, int] = Field(description="MQTT topic filter -> granted QoS")
    details: dict[str, Detail] = Field(
        description="per protocol: AMQP client properties and tuning, MQTT keep-alive, ..."
    )


_NO_SESSION = SessionInfo("", None, None, "tls_handshake")


def _transports(broker: Broker) -> Iterator[StreamTransport]:
    for conn in list(broker.connections):
        if isinstance(conn, StreamTransport):
            yield conn


def _find(broker: Broker, conn_id: str) -> StreamTransport:
    for conn in _transports(broker):
        if conn.conn_id == conn_id:
            return conn
    raise ConnectionNotFound(f"no connection {conn_id!r}")


def _consumer(conn: StreamTransport, info: SessionInfo, consumer: ConsumerInfo) -> Consumer:
    return Consumer(
        queue=consumer.queue,
        tag=consumer.tag,
        prefetch=consumer.prefetch,
        unacked=consumer.unacked,
        channel=consumer.channel,
        connection=conn.conn_id,
        protocol=info.protocol,
        user=info.user,
    )


def _summary(conn: StreamTransport, info: SessionInfo) -> dict[str, object]:
    return {
        "id": conn.conn_id,
        "protocol": info.protocol,
        "user": info.user,
        "client_id": info.client_id,
        "state": info.state,
        "peer_host": conn.peer_host,
        "peer_port": conn.peer_port,
        "tls": conn.over_tls,
        "tls_identity": conn.peer_identity,
        "connected_at": dt.datetime.fromtimestamp(conn.connected_at, dt.UTC),
        "bytes_in": conn.bytes_received,
        "bytes_out": conn.bytes_sent,
        "channels": info.channels,
        "consumers": len(info.consumers),
        "subscriptions": len(info.subscriptions),
    }


def list_connections(broker: Broker, protocol: str | None = None) -> list[Connection]:
    """Every client connection (of one protocol, if given), oldest first."""
    out: list[Connection] = []
    for conn in _transports(broker):
        info = conn.describe() or _NO_SESSION
        if protocol is None or info.protocol == protocol:
            out.append(Connection.model_validate(_summary(conn, info)))
    out.sort(key=lambda c: (c.connected_at, c.id))
    return out


def connection_detail(broker: Broker, conn_id: str) -> ConnectionDetail:
    """One connection with its consumers and subscriptions; ConnectionNotFound if gone."""
    conn = _find(broker, conn_id)
    info = conn.describe() or _NO_SESSION
    return ConnectionDetail.model_validate(
        {
            **_summary(conn, info),
            "consumer_list": [_consumer(conn, info, c) for c in info.consumers],
            "subscription_list": dict(info.subscriptions),
            "details": dict(info.details),
        }
    )


def close_connection(
    broker: Broker, conn_id: str, reason: str = DEFAULT_CLOSE_REASON
) -> Connection:
    """Close a connection, telling the client ``reason`` in its protocol's words: native
    Disconnect ``closed_by_operator: <reason>``, AMQP connection.close 320
    ``CONNECTION_FORCED - <reason>``, MQTT 3.1.1 (no server DISCONNECT) the socket closes
    without the will. Returns the connection as it was."""
    conn = _find(broker, conn_id)
    info = conn.describe() or _NO_SESSION
    before = Connection.model_validate(_summary(conn, info))
    log.info(
        "closing connection by operator",
        conn_id=conn_id,
        protocol=info.protocol,
        user=info.user,
        client_id=info.client_id,
        reason=reason,
    )
    conn.close_by_operator(reason or DEFAULT_CLOSE_REASON)
    return before


def list_consumers(broker: Broker, queue: str | None = None) -> list[Consumer]:
    """Every consumer of every connection (of one queue, if given), by queue then tag."""
    out: list[Consumer] = []
    for conn in _transports(broker):
        info = conn.describe()
        if info is None:
            continue
        out.extend(
            _consumer(conn, info, c) for c in info.consumers if queue is None or c.queue == queue
        )
    out.sort(key=lambda c: (c.queue, c.connection, c.tag))
    return out
