"""AMQP 0-9-1 connections against a real broker: the handshake (PLAIN, AMQPLAIN, the broker's
auth settings, a wrong protocol header, tune, vhosts), heartbeats, close, channels (many per
connection, interleaved content, flow), content split at frame-max, and errors as RabbitMQ
gives them -- channel-level ones close only that channel, connection-level ones close the
connection with connection.close and the right reply code, and nobody else is affected.

Clients are real: pika's ``BlockingConnection``, aio-pika, and :class:`amqputil.RawAmqp` (a
socket sending frames built with pamqp, or deliberately broken bytes) for what the libraries
will not do. The broker runs on a thread of its own (:class:`amqputil.AmqpBroker`), so the
blocking clients never starve it.
"""

from __future__ import annotations

import asyncio
import hashlib
import struct
import time
from collections.abc import Callable
from typing import Any

import aio_pika
import aiormq.exceptions
import pika
import pika.adapters.blocking_connection as blocking
import pika.exceptions
import pytest
from amqputil import (
    PROTOCOL_HEADER,
    WAIT,
    AmqpBroker,
    Bystander,
    PikaClients,
    RawAmqp,
    RawClients,
    amqplain_response,
    consume,
    frame,
    get_async,
    get_message,
    method_payload,
    pump_until,
    queue_counts,
    roundtrip_ok,
)
from pamqp import commands
from pamqp import frame as pamqp_frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader
from waits import wait_until

pytestmark = pytest.mark.timeout(60)

#: A body well over the default frame-max (131072): it travels as several body frames.
BIG = 500_000


def payload(size: int, seed: bytes = b"x") -> bytes:
    """``size`` deterministic, incompressible-looking bytes (every byte value occurs)."""
    out = bytearray()
    block = seed
    while len(out) < size:
        block = hashlib.sha256(block).digest()
        out += block
    return bytes(out[:size])


# --------------------------------------------------------------------------------------------
# The handshake: mechanisms and authentication


def test_pika_plain_handshake_and_server_properties(amqp: AmqpBroker, clients: PikaClients) -> None:
    conn = clients.connect(amqp.amqp_port, credentials=pika.PlainCredentials("guest", "guest"))
    props = conn._impl.server_properties
    assert props["product"] == "VibeMQ"
    caps = props["capabilities"]
    for cap in (
        "publisher_confirms",
        "basic.nack",
        "consumer_cancel_notify",
        "exchange_exchange_bindings",
        "authentication_failure_close",
    ):
        assert caps[cap] is True, cap
    roundtrip_ok(conn, "plain-q")
    assert amqp.amqp_connections() == 1


def test_raw_start_offers_plain_and_amqplain(amqp: AmqpBroker, raw: RawClients) -> None:
    client = raw(amqp.amqp_port)
    start = client.start()
    assert (start.version_major, start.version_minor) == (0, 9)
    assert set(start.mechanisms.split()) >= {"PLAIN", "AMQPLAIN"}
    assert "en_US" in start.locales.split()


def test_amqplain_handshake_and_publish(
    brokers: Callable[..., AmqpBroker], raw: RawClients
) -> None:
    amqp = brokers(users={"alice": "pw"})
    client = raw(amqp.amqp_port)
    client.handshake(username="alice", password="pw", mechanism="AMQPLAIN")
    client.open_channel(1)
    ok = client.rpc(1, commands.Queue.Declare(queue="amqplain-q"), commands.Queue.DeclareOk)
    assert ok.queue == "amqplain-q"
    client.publish(1, b"via AMQPLAIN", routing_key="amqplain-q")
    client.method(1, commands.Basic.Get(queue="amqplain-q", no_ack=True))
    method, header, body = client.message(1)
    assert isinstance(method, commands.Basic.GetOk)
    assert (method.routing_key, header.body_size, body) == ("amqplain-q", 12, b"via AMQPLAIN")


@pytest.mark.parametrize("mechanism", ["PLAIN", "AMQPLAIN"])
def test_wrong_password_is_refused_with_403(
    brokers: Callable[..., AmqpBroker], raw: RawClients, mechanism: str
) -> None:
    amqp = brokers(users={"alice": "pw"})
    client = raw(amqp.amqp_port)
    client.start()
    response = (
        amqplain_response("alice", "wrong") if mechanism == "AMQPLAIN" else b"\x00alice\x00wrong"
    )
    client.method(
        0,
        commands.Connection.StartOk(
            client_properties={"capabilities": {"authentication_failure_close": True}},
            mechanism=mechanism,
            response=response.decode("ascii"),
            locale="en_US",
        ),
    )
    close = client.expect_connection_close(403)
    assert close.reply_text.startswith("ACCESS_REFUSED")
    assert mechanism in close.reply_text
    wait_until(lambda: amqp.amqp_connections() == 0, "the refused connection to go")


def test_unknown_mechanism_is_refused(amqp: AmqpBroker, raw: RawClients) -> None:
    client = raw(amqp.amqp_port)
    client.start()
    client.method(
        0,
        commands.Connection.StartOk(
            client_properties={}, mechanism="EXTERNAL", response="", locale="en_US"
        ),
    )
    close = client.expect_connection_close(503)
    assert "EXTERNAL" in close.reply_text


AUTH_CASES = [
    # (username, password, accepted): auth_tokens=["s3cret"], users={"alice": "pw"}
    ("anyone", "s3cret", True),  # a token is a password for any user name
    ("alice", "s3cret", True),
    ("alice", "pw", True),
    ("alice", "wrong", False),
    ("bob", "pw", False),  # alice's password is not bob's
    ("guest", "guest", False),  # no guest once auth is on
    ("", "", False),
]


@pytest.mark.parametrize(("username", "password", "accepted"), AUTH_CASES)
def test_pika_auth_against_broker_settings(
    brokers: Callable[..., AmqpBroker],
    clients: PikaClients,
    username: str,
    password: str,
    accepted: bool,
) -> None:
    amqp = brokers(auth_tokens=["s3cret"], users={"alice": "pw"})
    credentials = pika.PlainCredentials(username, password)
    if accepted:
        conn = clients.connect(amqp.amqp_port, credentials=credentials)
        roundtrip_ok(conn, "auth-q")
        return
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        clients.connect(amqp.amqp_port, credentials=credentials)
    assert "403" in str(info.value) and "ACCESS_REFUSED" in str(info.value)
    wait_until(lambda: amqp.amqp_connections() == 0, "the refused connection to go")


def test_without_users_guest_gets_in_from_loopback_and_nobody_else(
    amqp: AmqpBroker, clients: PikaClients
) -> None:
    """RabbitMQ's default: guest/guest from loopback; any other credentials match nobody."""
    conn = clients.connect(amqp.amqp_port, credentials=pika.PlainCredentials("guest", "guest"))
    roundtrip_ok(conn, "anyone-q")
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        clients.connect(amqp.amqp_port, credentials=pika.PlainCredentials("who", "ever"))
    assert "403" in str(info.value) and "ACCESS_REFUSED" in str(info.value)


async def test_aio_pika_auth(brokers: Callable[..., AmqpBroker]) -> None:
    amqp = brokers(users={"alice": "pw"})
    url = f"amqp://alice:{{}}@127.0.0.1:{amqp.amqp_port}/"
    with pytest.raises(aiormq.exceptions.ProbableAuthenticationError):
        await aio_pika.connect(url.format("nope"), timeout=WAIT)
    conn = await aio_pika.connect(url.format("pw"), timeout=WAIT)
    try:
        channel = await conn.channel()
        queue = await channel.declare_queue("aio-auth-q")
        await channel.default_exchange.publish(aio_pika.Message(b"hi"), "aio-auth-q")
        got = await get_async(queue)
        assert got.body == b"hi"
    finally:
        await conn.close()


# --------------------------------------------------------------------------------------------
# The protocol header


@pytest.mark.parametrize(
    "header",
    [
        b"AMQP\x00\x00\x08\x00",  # 0-8
        b"AMQP\x01\x01\x00\x09",  # 0-9 in the old layout
        b"AMQP\x00\x01\x00\x00",  # AMQP 1.0
        b"AMQP\x03\x01\x00\x00",  # AMQP 1.0 SASL
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    ],
    ids=["0-8", "0-9-old", "1.0", "1.0-sasl", "http"],
)
def test_wrong_protocol_header_gets_ours_back_and_a_close(
    amqp: AmqpBroker, raw: RawClients, header: bytes
) -> None:
    client = raw(amqp.amqp_port)
    client.send(header)
    assert client.read_exact(8) == PROTOCOL_HEADER == b"AMQP\x00\x00\x09\x01"
    assert client.wait_closed() == []
    wait_until(lambda: amqp.amqp_connections() == 0, "the connection to go")


def test_protocol_header_in_pieces(amqp: AmqpBroker, raw: RawClients) -> None:
    client = raw(amqp.amqp_port)
    for byte in PROTOCOL_HEADER:
        client.send(bytes([byte]))
    client.expect(commands.Connection.Start, 0)


# --------------------------------------------------------------------------------------------
# Tune: frame-max, channel-max, heartbeat


def test_tune_proposes_the_configured_limits(
    brokers: Callable[..., AmqpBroker], raw: RawClients
) -> None:
    amqp = brokers(amqp={"frame_max": 65536, "channel_max": 100, "heartbeat_s": 30})
    tune = raw(amqp.amqp_port).login()
    assert (tune.frame_max, tune.channel_max, tune.heartbeat) == (65536, 100, 30)


def test_pika_negotiates_lower_limits(amqp: AmqpBroker, clients: PikaClients) -> None:
    conn = clients.connect(amqp.amqp_port, frame_max=8192, channel_max=10, heartbeat=7)
    assert amqp.negotiated() == [(8192, 10, 7)]
    # A body of many frames of the negotiated size, both ways.
    body = payload(50_000)
    channel = conn.channel()
    channel.queue_declare("small-frames")
    channel.basic_publish("", "small-frames", body)
    assert get_message(channel, "small-frames")[2] == body


@pytest.mark.parametrize("frame_max", [1024, 4095, 131073, 1_000_000])
def test_tune_ok_frame_max_out_of_range_is_530(
    amqp: AmqpBroker, raw: RawClients, frame_max: int
) -> None:
    client = raw(amqp.amqp_port)
    tune = client.login()
    client.method(
        0,
        commands.Connection.TuneOk(channel_max=tune.channel_max, frame_max=frame_max, heartbeat=0),
    )
    close = client.expect_connection_close(530)
    assert str(frame_max) in close.reply_text


def test_pika_heartbeat_keeps_an_idle_connection(amqp: AmqpBroker, clients: PikaClients) -> None:
    conn = clients.connect(amqp.amqp_port, heartbeat=2)
    assert amqp.negotiated() == [(131072, 2047, 2)]
    conn.sleep(5.0)  # idle, but pika's I/O loop runs: heartbeats both ways
    assert conn.is_open
    roundtrip_ok(conn, "after-idle")
    assert amqp.amqp_connections() == 1


def test_raw_heartbeats_keep_a_connection_alive(amqp: AmqpBroker, raw: RawClients) -> None:
    client = raw(amqp.amqp_port)
    client.handshake(heartbeat=1)
    client.open_channel(1)
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        client.send(b"\x08\x00\x00\x00\x00\x00\x00\xce")
        time.sleep(0.3)
    ok = client.rpc(1, commands.Queue.Declare(queue="hb-q"), commands.Queue.DeclareOk)
    assert ok.queue == "hb-q"
    assert client.heartbeats >= 1  # the broker sends its own too


def test_silent_peer_is_dropped_after_missed_heartbeats(
    amqp: AmqpBroker, raw: RawClients, clients: PikaClients
) -> None:
    other = clients.connect(amqp.amqp_port)
    client = raw(amqp.amqp_port)
    client.handshake(heartbeat=1)
    client.open_channel(1)
    # Silent from now on: the broker must close the socket (after two missed intervals).
    frames = client.wait_closed(timeout=15.0)
    assert frames == []
    assert client.heartbeats >= 1  # it kept sending heartbeats until it gave up
    wait_until(lambda: amqp.amqp_connections() == 1, "the silent connection to go")
    assert other.is_open
    roundtrip_ok(other, "still-here")


def test_handshake_must_complete(brokers: Callable[..., AmqpBroker], raw: RawClients) -> None:
    amqp = brokers(amqp={"handshake_timeout_s": 0.5})
    client = raw(amqp.amqp_port)
    client.start()  # and then nothing
    client.wait_closed()


# --------------------------------------------------------------------------------------------
# Open: vhosts


def test_raw_open_of_another_vhost_is_530(amqp: AmqpBroker, raw: RawClients) -> None:
    client = raw(amqp.amqp_port)
    tune = client.login()
    client.method(
        0, commands.Connection.TuneOk(channel_max=tune.channel_max, frame_max=tune.frame_max)
    )
    client.method(0, commands.Connection.Open(virtual_host="other"))
    close = client.expect_connection_close(530)
    assert close.reply_text.startswith("NOT_ALLOWED")
    assert "other" in close.reply_text
    assert (close.class_id, close.method_id) == (10, 40)


def test_pika_vhost_slash_is_fine_and_others_are_refused(
    amqp: AmqpBroker, clients: PikaClients
) -> None:
    roundtrip_ok(clients.connect(amqp.amqp_port, virtual_host="/"), "vhost-q")
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        clients.connect(amqp.amqp_port, virtual_host="staging")
    assert "530" in str(info.value)


async def test_aio_pika_other_vhost_is_refused(amqp: AmqpBroker) -> None:
    # aiormq reports a connection.close in answer to connection.open as an unexpected frame
    # (it does the same with RabbitMQ); what matters is that the broker closed.
    with pytest.raises(aiormq.exceptions.AMQPError, match=r"Connection\.Close"):
        await aio_pika.connect(
            f"amqp://guest:guest@127.0.0.1:{amqp.amqp_port}/staging", timeout=WAIT
        )
    wait_until(lambda: amqp.amqp_connections() == 0, "the refused connection to go")


# --------------------------------------------------------------------------------------------
# Close


def test_raw_connection_close_gets_close_ok(amqp: AmqpBroker, raw: RawClients) -> None:
    client = raw(amqp.amqp_port)
    client.handshake()
    client.open_channel(1)
    client.rpc(1, commands.Queue.Declare(queue="closing-q"), commands.Queue.DeclareOk)
    client.method(
        0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
    )
    client.expect(commands.Connection.CloseOk, 0)
    client.wait_closed()
    wait_until(lambda: amqp.amqp_connections() == 0, "the connection to go")
    assert amqp.has_queue("closing-q")  # not exclusive: it stays


def test_close_before_open(amqp: AmqpBroker, raw: RawClients) -> None:
    client = raw(amqp.amqp_port)
    tune = client.login()
    client.method(
        0, commands.Connection.TuneOk(channel_max=tune.channel_max, frame_max=tune.frame_max)
    )
    client.method(
        0,
        commands.Connection.Close(
            reply_code=200, reply_text="changed my mind", class_id=0, method_id=0
        ),
    )
    client.expect(commands.Connection.CloseOk, 0)
    client.wait_closed()


def test_pika_close_requeues_unacknowledged(amqp: AmqpBroker, clients: PikaClients) -> None:
    first = clients.connect(amqp.amqp_port)
    channel = first.channel()
    channel.queue_declare("unacked-q")
    channel.basic_publish("", "unacked-q", b"one")
    method, _props, body = get_message(channel, "unacked-q", auto_ack=False)
    assert (body, method.redelivered) == (b"one", False)
    first.close()
    second = clients.connect(amqp.amqp_port).channel()
    method, _props, body = get_message(second, "unacked-q")
    assert (body, method.redelivered) == (b"one", True)


def test_broker_ignores_frames_after_its_close_until_close_ok(
    amqp: AmqpBroker, raw: RawClients
) -> None:
    client = raw(amqp.amqp_port)
    client.handshake()
    client.method(7, commands.Queue.Declare(queue="x"))  # channel 7 is not open: 504
    client.expect(commands.Connection.Close, 0)
    client.method(1, commands.Channel.Open())  # ignored while closing
    client.publish(1, b"ignored", routing_key="x")
    client.method(0, commands.Connection.CloseOk())
    assert client.wait_closed() == []
    assert not amqp.has_queue("x")


# --------------------------------------------------------------------------------------------
# Channels


def test_many_channels_with_interleaved_publishes(amqp: AmqpBroker, clients: PikaClients) -> None:
    conn = clients.connect(amqp.amqp_port)
    channels = [conn.channel() for _ in range(20)]
    assert len({ch.channel_number for ch in channels}) == 20
    for i, ch in enumerate(channels):
        ch.queue_declare(f"multi-{i}")
    for n in range(25):
        for i, ch in enumerate(channels):
            ch.basic_publish("", f"multi-{i}", f"{i}:{n}".encode())
    for i, ch in enumerate(channels):
        bodies = [body for _m, _p, body in consume(ch, f"multi-{i}", 25)]
        assert bodies == [f"{i}:{n}".encode() for n in range(25)]


def test_content_frames_interleaved_across_channels(amqp: AmqpBroker, raw: RawClients) -> None:
    client = raw(amqp.amqp_port)
    client.handshake()
    for ch in (1, 2):
        client.open_channel(ch)
        client.rpc(ch, commands.Queue.Declare(queue=f"inter-{ch}"), commands.Queue.DeclareOk)
    body1, body2 = payload(9000, b"one"), payload(7000, b"two")

    def marshal(ch: int, value: Any) -> bytes:
        return pamqp_frame.marshal(value, ch)

    client.send(
        marshal(1, commands.Basic.Publish(routing_key="inter-1"))
        + marshal(2, commands.Basic.Publish(routing_key="inter-2"))
        + marshal(2, ContentHeader(0, len(body2), commands.Basic.Properties(message_id="b2")))
        + marshal(1, ContentHeader(0, len(body1), commands.Basic.Properties(message_id="b1")))
        + marshal(2, ContentBody(body2[:3000]))
        + marshal(1, ContentBody(body1[:4000]))
        + marshal(1, ContentBody(body1[4000:8000]))
        + marshal(2, ContentBody(body2[3000:]))
        + marshal(1, ContentBody(body1[8000:]))
    )
    for ch, body, msg_id in ((1, body1, "b1"), (2, body2, "b2")):
        client.method(ch, commands.Basic.Get(queue=f"inter-{ch}", no_ack=True))
        _method, header, got = client.message(ch)
        assert got == body
        assert header.properties.message_id == msg_id


def test_channel_close_and_reopen_same_number(amqp: AmqpBroker, raw: RawClients) -> None:
    client = raw(amqp.amqp_port)
    client.handshake()
    client.open_channel(5)
    client.rpc(
        5,
        commands.Channel.Close(reply_code=200, reply_text="done", class_id=0, method_id=0),
        commands.Channel.CloseOk,
    )
    client.open_channel(5)
    client.rpc(5, commands.Queue.Declare(queue="reopened"), commands.Queue.DeclareOk)


def test_channel_flow_raw(amqp: AmqpBroker, raw: RawClients) -> None:
    client = raw(amqp.amqp_port)
    client.handshake()
    client.open_channel(1)
    client.open_channel(2)
    client.rpc(1, commands.Queue.Declare(queue="flow-q"), commands.Queue.DeclareOk)
    client.rpc(
        1,
        commands.Basic.Consume(queue="flow-q", consumer_tag="flowc", no_ack=True),
        commands.Basic.ConsumeOk,
    )
    ok = client.rpc(1, commands.Channel.Flow(active=False), commands.Channel.FlowOk)
    assert ok.active is False
    client.publish(2, b"held back", routing_key="flow-q")
    # A synchronous method on channel 2 after the publish: the message is routed by now,
    # and it is still ready in the queue, not delivered to the paused consumer.
    ok2 = client.rpc(
        2, commands.Queue.Declare(queue="flow-q", passive=True), commands.Queue.DeclareOk
    )
    assert (ok2.message_count, ok2.consumer_count) == (1, 1)
    ok = client.rpc(1, commands.Channel.Flow(active=True), commands.Channel.FlowOk)
    assert ok.active is True
    method, _header, body = client.message(1)
    assert isinstance(method, commands.Basic.Deliver)
    assert (method.consumer_tag, body) == ("flowc", b"held back")


def test_channel_flow_pika(amqp: AmqpBroker, clients: PikaClients) -> None:
    conn = clients.connect(amqp.amqp_port)
    channel = conn.channel()
    channel.queue_declare("flow-pika")
    got: list[bytes] = []
    channel.basic_consume("flow-pika", lambda _ch, _m, _p, body: got.append(body), auto_ack=True)
    assert channel.flow(False) is False
    other = conn.channel()
    other.basic_publish("", "flow-pika", b"later")
    assert queue_counts(other, "flow-pika") == (1, 1)
    assert channel.flow(True) is True
    pump_until(conn, lambda: bool(got), "the delivery once flow is on again")
    assert got == [b"later"]


# --------------------------------------------------------------------------------------------
# Content larger than frame-max


def test_large_body_both_ways_pika(amqp: AmqpBroker, clients: PikaClients) -> None:
    conn = clients.connect(amqp.amqp_port)
    channel = conn.channel()
    channel.queue_declare("big-q")
    body = payload(BIG)
    props = pika.BasicProperties(content_type="application/octet-stream", headers={"n": 1})
    channel.basic_publish("", "big-q", body, props)
    ((_m, got_props, got),) = consume(channel, "big-q", 1)
    assert got == body
    assert got_props.content_type == "application/octet-stream"
    assert got_props.headers == {"n": 1}


async def test_large_body_both_ways_aio_pika(amqp: AmqpBroker) -> None:
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{amqp.amqp_port}/", timeout=WAIT)
    try:
        channel = await conn.channel()
        queue = await channel.declare_queue("big-aio")
        body = payload(BIG, b"aio")
        await channel.default_exchange.publish(aio_pika.Message(body, message_id="big"), "big-aio")
        msg = await get_async(queue)
        assert msg.body == body
        assert msg.message_id == "big"
    finally:
        await conn.close()


def test_body_split_at_negotiated_frame_max_raw(amqp: AmqpBroker, raw: RawClients) -> None:
    client = raw(amqp.amqp_port)
    client.handshake(frame_max=4096)
    client.open_channel(1)
    client.rpc(1, commands.Queue.Declare(queue="split-q"), commands.Queue.DeclareOk)
    body = payload(BIG, b"split")
    client.publish(1, body, routing_key="split-q", chunk=1000)  # reassembled by the broker
    client.method(1, commands.Basic.Get(queue="split-q", no_ack=True))
    client.expect(commands.Basic.GetOk, 1)
    header = client.expect(ContentHeader, 1)
    assert header.body_size == BIG
    chunks: list[bytes] = []
    while sum(map(len, chunks)) < BIG:
        chunks.append(client.expect(ContentBody, 1).value)
    assert b"".join(chunks) == body
    # Every body frame is as large as frame-max allows (4096 with header and frame-end),
    # except the last.
    assert all(len(c) == 4096 - 8 for c in chunks[:-1])
    assert 0 < len(chunks[-1]) <= 4096 - 8
    assert len(chunks) == -(-BIG // (4096 - 8))


def test_frame_size_limit_is_the_negotiated_frame_max(amqp: AmqpBroker, raw: RawClients) -> None:
    """A body frame with a payload of frame-max bytes is taken (the broker leaves room for
    clients that forget the 8 framing bytes, as RabbitMQ does); one byte more is 501."""
    client = raw(amqp.amqp_port)
    client.handshake(frame_max=4096)
    client.open_channel(1)
    client.rpc(1, commands.Queue.Declare(queue="limit-q"), commands.Queue.DeclareOk)
    client.publish(1, payload(4096), routing_key="limit-q", chunk=4096)
    ok = client.rpc(
        1, commands.Queue.Declare(queue="limit-q", passive=True), commands.Queue.DeclareOk
    )
    assert ok.message_count == 1
    client.publish(1, payload(4097), routing_key="limit-q", chunk=4097)
    close = client.expect_connection_close(501)
    assert "4097" in close.reply_text


def test_empty_body(amqp: AmqpBroker, raw: RawClients) -> None:
    client = raw(amqp.amqp_port)
    client.handshake()
    client.open_channel(1)
    client.rpc(1, commands.Queue.Declare(queue="empty-q"), commands.Queue.DeclareOk)
    client.publish(1, b"", routing_key="empty-q")  # a header with body-size 0, no body frame
    client.method(1, commands.Basic.Get(queue="empty-q", no_ack=True))
    _method, header, body = client.message(1)
    assert (header.body_size, body) == (0, b"")


# --------------------------------------------------------------------------------------------
# Channel-level errors: only that channel closes


def _noop(*_args: Any) -> None:
    pass


class ErrorScene:
    """What the channel-error cases act on, set up by an owner connection (which also holds an
    exclusive queue and a consumer)."""

    def __init__(self, owner: pika.BlockingConnection) -> None:
        ch = owner.channel()
        ch.queue_declare("err-plain")
        ch.queue_declare("err-full")
        ch.basic_publish("", "err-full", b"m")
        ch.queue_declare("err-used")
        ch.basic_consume("err-used", _noop)
        ch.queue_declare("err-excl", exclusive=True)
        ch.exchange_declare("err-x", "direct")
        ch.queue_bind("err-plain", "err-x", "k")
        ch.exchange_declare("err-internal", "topic", internal=True)
        assert queue_counts(ch, "err-full") == (1, 0)
        self.channel = ch


CHANNEL_ERRORS: dict[str, tuple[int, Callable[[blocking.BlockingChannel], Any]]] = {
    # 404 NOT_FOUND
    "publish to a missing exchange": (404, lambda ch: ch.basic_publish("no-x", "k", b"x")),
    "consume from a missing queue": (404, lambda ch: ch.basic_consume("no-q", _noop)),
    "get from a missing queue": (404, lambda ch: ch.basic_get("no-q")),
    "passive declare of a missing queue": (404, lambda ch: ch.queue_declare("no-q", passive=True)),
    "passive declare of a missing exchange": (
        404,
        lambda ch: ch.exchange_declare("no-x", passive=True),
    ),
    "bind to a missing exchange": (404, lambda ch: ch.queue_bind("err-plain", "no-x", "k")),
    "bind a missing queue": (404, lambda ch: ch.queue_bind("no-q", "err-x", "k")),
    "exchange bind with a missing source": (
        404,
        lambda ch: ch.exchange_bind("err-x", "no-x", "k"),
    ),
    "purge a missing queue": (404, lambda ch: ch.queue_purge("no-q")),
    # 405 RESOURCE_LOCKED: another connection's exclusive queue
    "declare another connection's exclusive queue": (
        405,
        lambda ch: ch.queue_declare("err-excl"),
    ),
    "consume another connection's exclusive queue": (
        405,
        lambda ch: ch.basic_consume("err-excl", _noop),
    ),
    "get from another connection's exclusive queue": (405, lambda ch: ch.basic_get("err-excl")),
    "purge another connection's exclusive queue": (405, lambda ch: ch.queue_purge("err-excl")),
    "delete another connection's exclusive queue": (405, lambda ch: ch.queue_delete("err-excl")),
    "bind another connection's exclusive queue": (
        405,
        lambda ch: ch.queue_bind("err-excl", "err-x", "k"),
    ),
    # 406 PRECONDITION_FAILED
    "redeclare a queue as durable": (406, lambda ch: ch.queue_declare("err-plain", durable=True)),
    "redeclare a queue with other arguments": (
        406,
        lambda ch: ch.queue_declare("err-plain", arguments={"x-max-length": 5}),
    ),
    "redeclare an exchange with another type": (
        406,
        lambda ch: ch.exchange_declare("err-x", "fanout"),
    ),
    "redeclare an exchange as durable": (
        406,
        lambda ch: ch.exchange_declare("err-x", "direct", durable=True),
    ),
    "redeclare amq.direct as fanout": (406, lambda ch: ch.exchange_declare("amq.direct", "fanout")),
    "ack an unknown delivery tag": (406, lambda ch: ch.basic_ack(42)),
    "nack an unknown delivery tag": (406, lambda ch: ch.basic_nack(42)),
    "reject an unknown delivery tag": (406, lambda ch: ch.basic_reject(42)),
    "queue delete if-unused with a consumer": (
        406,
        lambda ch: ch.queue_delete("err-used", if_unused=True),
    ),
    "queue delete if-empty with a message": (
        406,
        lambda ch: ch.queue_delete("err-full", if_empty=True),
    ),
    "exchange delete if-unused with a binding": (
        406,
        lambda ch: ch.exchange_delete("err-x", if_unused=True),
    ),
    "invalid queue argument": (
        406,
        lambda ch: ch.queue_declare("err-args", arguments={"x-max-length": "many"}),
    ),
    # 403 ACCESS_REFUSED
    "declare an amq.* queue": (403, lambda ch: ch.queue_declare("amq.mine")),
    "declare the broker's own $ queue": (
        403,
        lambda ch: ch.queue_declare("$amqp.bindings", durable=True),
    ),
    "declare an amq.* exchange": (403, lambda ch: ch.exchange_declare("amq.mine", "direct")),
    "publish to an internal exchange": (
        403,
        lambda ch: ch.basic_publish("err-internal", "k", b"x"),
    ),
    "delete amq.direct": (403, lambda ch: ch.exchange_delete("amq.direct")),
    "bind to the default exchange": (403, lambda ch: ch.queue_bind("err-plain", "", "k")),
    "exclusive consume of a queue with consumers": (
        403,
        lambda ch: ch.basic_consume("err-used", _noop, exclusive=True),
    ),
}

_NAMES = {
    403: "ACCESS_REFUSED",
    404: "NOT_FOUND",
    405: "RESOURCE_LOCKED",
    406: "PRECONDITION_FAILED",
}


@pytest.mark.parametrize("case", list(CHANNEL_ERRORS))
def test_channel_error_closes_only_that_channel(
    amqp: AmqpBroker, clients: PikaClients, bystander: Bystander, case: str
) -> None:
    scene = ErrorScene(bystander.conn)
    code, action = CHANNEL_ERRORS[case]
    conn = clients.connect(amqp.amqp_port)
    spare = conn.channel()
    channel = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        action(channel)
        channel.basic_qos()  # a synchronous method: brings out the error of an asynchronous one
    assert info.value.reply_code == code, info.value
    assert info.value.reply_text.startswith(_NAMES[code] + " - ")
    assert channel.is_closed
    # The connection, its other channels and other connections keep working.
    assert conn.is_open and spare.is_open
    spare.queue_declare("spare-q")
    roundtrip_ok(conn, "after-error")
    assert scene.channel.is_open
    assert queue_counts(scene.channel, "err-full") == (1, 0)
    assert queue_counts(scene.channel, "err-used") == (0, 1)


def test_channel_error_on_a_raw_channel_answers_close_ok(
    amqp: AmqpBroker, raw: RawClients, bystander: Bystander
) -> None:
    client = raw(amqp.amqp_port)
    client.handshake()
    client.open_channel(1)
    client.open_channel(2)
    client.method(1, commands.Queue.Declare(queue="nope", passive=True))
    close = client.expect(commands.Channel.Close, 1)
    assert close.reply_code == 404
    assert (close.class_id, close.method_id) == (50, 10)
    assert "nope" in close.reply_text
    # Until close-ok, everything else on channel 1 is dropped; channel 2 works meanwhile.
    client.method(1, commands.Queue.Declare(queue="dropped"))
    client.rpc(2, commands.Queue.Declare(queue="ch2-q"), commands.Queue.DeclareOk)
    client.method(1, commands.Channel.CloseOk())
    client.open_channel(1)  # the number is free again
    client.rpc(1, commands.Queue.Declare(queue="ch1-again"), commands.Queue.DeclareOk)
    assert not amqp.has_queue("dropped")


@pytest.mark.parametrize(
    ("code", "exc"),
    [
        (404, aiormq.exceptions.ChannelNotFoundEntity),
        (405, aiormq.exceptions.ChannelLockedResource),
        (406, aiormq.exceptions.ChannelPreconditionFailed),
        (403, aiormq.exceptions.ChannelAccessRefused),
    ],
)
async def test_aio_pika_channel_errors(amqp: AmqpBroker, code: int, exc: type[Exception]) -> None:
    url = f"amqp://guest:guest@127.0.0.1:{amqp.amqp_port}/"
    owner = await aio_pika.connect(url, timeout=WAIT)
    conn = await aio_pika.connect(url, timeout=WAIT)
    try:
        owner_ch = await owner.channel()
        await owner_ch.declare_queue("aio-excl", exclusive=True)
        await owner_ch.declare_queue("aio-plain")
        channel = await conn.channel()
        with pytest.raises(exc):
            if code == 404:
                await channel.declare_queue("aio-missing", passive=True)
            elif code == 405:
                await channel.declare_queue("aio-excl")
            elif code == 406:
                await channel.declare_queue("aio-plain", durable=True)
            else:
                await channel.declare_exchange("amq.aio", aio_pika.ExchangeType.DIRECT)
        assert channel.is_closed
        assert not conn.is_closed
        other = await conn.channel()
        queue = await other.declare_queue("aio-after")
        await other.default_exchange.publish(aio_pika.Message(b"ok"), "aio-after")
        assert (await get_async(queue)).body == b"ok"
        assert (await owner_ch.declare_queue("aio-plain", passive=True)).name == "aio-plain"
    finally:
        await conn.close()
        await owner.close()


# --------------------------------------------------------------------------------------------
# Connection-level errors: connection.close with the reply code


def _method_frame(channel: int, class_id: int, method_id: int, args: bytes = b"") -> bytes:
    return frame(1, channel, method_payload(class_id, method_id, args))


def _qos_args() -> bytes:
    return struct.pack(">IHB", 0, 10, 0)


CONNECTION_ERRORS: dict[str, tuple[int, Callable[[RawAmqp], None]]] = {
    # 501 FRAME_ERROR
    "bad frame-end": (
        501,
        lambda c: c.send(frame(1, 1, method_payload(60, 10, _qos_args()), end=b"\x00")),
    ),
    "frame larger than frame-max": (
        501,
        lambda c: c.send(struct.pack(">BHI", 3, 1, 200_000) + b"\x00" * 1000),
    ),
    "unknown frame type": (501, lambda c: c.send(frame(9, 1, b"abc"))),
    "body larger than its header said": (
        501,
        lambda c: c.send(
            pamqp_frame.marshal(commands.Basic.Publish(routing_key="q"), 1)
            + pamqp_frame.marshal(ContentHeader(0, 3, commands.Basic.Properties()), 1)
            + pamqp_frame.marshal(ContentBody(b"12345"), 1)
        ),
    ),
    # 502 SYNTAX_ERROR
    "truncated method arguments": (502, lambda c: c.send(_method_frame(1, 50, 10, b"\x00"))),
    # 503 COMMAND_INVALID
    "channel method on channel 0": (503, lambda c: c.send(_method_frame(0, 60, 10, _qos_args()))),
    "connection method on a channel": (
        503,
        lambda c: c.method(1, commands.Connection.Open(virtual_host="/")),
    ),
    "client sends basic.deliver": (
        503,
        lambda c: c.method(
            1,
            commands.Basic.Deliver(consumer_tag="x", delivery_tag=1, exchange="", routing_key="q"),
        ),
    ),
    # 504 CHANNEL_ERROR
    "method on an unopened channel": (
        504,
        lambda c: c.method(3, commands.Queue.Declare(queue="q")),
    ),
    "content header on an unopened channel": (
        504,
        lambda c: c.send_frame(3, ContentHeader(0, 1, commands.Basic.Properties())),
    ),
    "second channel.open": (504, lambda c: c.method(1, commands.Channel.Open())),
    # 505 UNEXPECTED_FRAME
    "content header without publish": (
        505,
        lambda c: c.send_frame(1, ContentHeader(0, 1, commands.Basic.Properties())),
    ),
    "content body without publish": (505, lambda c: c.send_frame(1, ContentBody(b"x"))),
    "method where content was expected": (
        505,
        lambda c: c.send(
            pamqp_frame.marshal(commands.Basic.Publish(routing_key="q"), 1)
            + pamqp_frame.marshal(commands.Queue.Declare(queue="q"), 1)
        ),
    ),
    "content header of another class": (
        505,
        lambda c: c.send(
            pamqp_frame.marshal(commands.Basic.Publish(routing_key="q"), 1)
            + frame(2, 1, struct.pack(">HHQH", 50, 0, 1, 0))
        ),
    ),
    # 530 NOT_ALLOWED
    "reused consumer tag": (
        530,
        lambda c: c.send(
            pamqp_frame.marshal(commands.Queue.Declare(queue="tagq"), 1)
            + pamqp_frame.marshal(commands.Basic.Consume(queue="tagq", consumer_tag="t"), 1)
            + pamqp_frame.marshal(commands.Basic.Consume(queue="tagq", consumer_tag="t"), 1)
        ),
    ),
    # 540 NOT_IMPLEMENTED
    "unknown method id": (540, lambda c: c.send(_method_frame(1, 60, 999))),
    "unknown class id": (540, lambda c: c.send(_method_frame(1, 999, 10))),
}


@pytest.mark.parametrize("case", list(CONNECTION_ERRORS))
def test_connection_error_closes_the_connection(
    amqp: AmqpBroker, raw: RawClients, bystander: Bystander, case: str
) -> None:
    code, action = CONNECTION_ERRORS[case]
    client = raw(amqp.amqp_port)
    client.handshake(frame_max=65536)
    client.open_channel(1)
    action(client)
    close = client.expect_connection_close(code)
    assert close.reply_text, "the reply text says what was wrong"
    wait_until(lambda: amqp.amqp_connections() == 1, "only the bystander left")


def test_connection_error_before_open(amqp: AmqpBroker, raw: RawClients) -> None:
    client = raw(amqp.amqp_port)
    client.login()
    client.method(1, commands.Channel.Open())  # before tune-ok / open
    client.expect_connection_close(504)


def test_pika_sees_connection_error_and_others_do_not(
    amqp: AmqpBroker, clients: PikaClients, raw: RawClients
) -> None:
    """A client whose connection is closed with an error, and one beside it that is not."""
    conn = clients.connect(amqp.amqp_port)
    channel = conn.channel()
    channel.queue_declare("shared-q")
    channel.basic_publish("", "shared-q", b"stored")
    bad = raw(amqp.amqp_port)
    bad.handshake()
    bad.send(frame(1, 1, b"\x00\x3c\x00\x0a", end=b"\xff"))
    bad.expect_connection_close(501)
    assert queue_counts(channel, "shared-q") == (1, 0)
    assert get_message(channel, "shared-q")[2] == b"stored"


# --------------------------------------------------------------------------------------------
# aio-pika


async def test_aio_pika_many_channels(aio: aio_pika.abc.AbstractConnection) -> None:
    channels = [await aio.channel() for _ in range(10)]
    queues = [await ch.declare_queue(f"aio-multi-{i}") for i, ch in enumerate(channels)]
    await asyncio.gather(
        *(
            ch.default_exchange.publish(aio_pika.Message(f"{i}:{n}".encode()), f"aio-multi-{i}")
            for n in range(10)
            for i, ch in enumerate(channels)
        )
    )
    for i, queue in enumerate(queues):
        bodies = {(await get_async(queue)).body for _ in range(10)}
        assert bodies == {f"{i}:{n}".encode() for n in range(10)}
