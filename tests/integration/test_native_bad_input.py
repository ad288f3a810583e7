"""Malformed and abusive input over raw sockets: the right Error, and nobody else is hurt.

Each case runs on its own connection. Afterwards a client that was connected all along must
still do a publish/subscribe round trip, and the messages stored before must be intact.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from rawclient import Closed, RawClient, assert_error, assert_ok, new_id

from vibemq_server.protocol import CommandType, Message, encode_body
from vibemq_server.protocol.codec import DEFAULT_MAX_MESSAGE_SIZE, frame

BrokerFactory = Callable[..., Awaitable[Any]]
T = CommandType
STORED = [("kept_1", {"a": 1}), ("kept_2", {"b": "two"})]


@dataclass
class World:
    broker: Any
    witness: RawClient

    async def bad_client(self, *, connect: bool = True) -> RawClient:
        if connect:
            return await RawClient.connected(self.broker.port)
        return await RawClient.open(self.broker.port)

    async def assert_healthy(self) -> None:
        """The witness still works and the stored messages are intact."""
        w = self.witness
        assert_ok(await w.ping(), T.PONG)
        queue = new_id("roundtrip")
        assert_ok(await w.subscribe(queue), T.SUBSCRIBE_ACK)
        assert_ok(await w.publish(queue, {"ok": True}, msg_id=f"{queue}_m"), T.PUBLISH_ACK)
        d = await w.delivery(queue)
        assert (d.id, d.json()) == (f"{queue}_m", {"ok": True})
        w.ack(d.id)
        assert_ok(await w.unsubscribe(queue), T.UNSUBSCRIBE_ACK)
        info = assert_ok(await w.queue_info("kept"), T.QUEUE_INFO).json()
        assert info["messageCount"] == len(STORED)  # type: ignore[index]
        # Read them without consuming: subscribe, take them, then unsubscribe unacked.
        assert_ok(await w.subscribe("kept"), T.SUBSCRIBE_ACK)
        got = await w.deliveries(len(STORED), "kept")
        assert [(d.id, d.json()) for d in got] == STORED
        assert_ok(await w.unsubscribe("kept"), T.UNSUBSCRIBE_ACK)


async def make_world(broker: Any) -> World:
    witness = await RawClient.connected(broker.port)
    for mid, payload in STORED:
        assert_ok(await witness.publish("kept", payload, msg_id=mid), T.PUBLISH_ACK)
    return World(broker, witness)


@pytest.fixture
async def world(broker: Any) -> AsyncIterator[World]:
    w = await make_world(broker)
    yield w
    await w.witness.close()


def body_of(msg: Message) -> bytearray:
    return bytearray(encode_body(msg))


def text(raw: bytes) -> bytes:
    return struct.pack(">H", len(raw)) + raw


def hand_body(
    type_byte: int,
    msg_id: bytes,
    queue: bytes = b"",
    payload: bytes = b"",
    headers: list[tuple[bytes, bytes]] | None = None,
    version: int = 1,
) -> bytes:
    """A body built byte by byte, so any field can hold anything."""
    parts = [bytes([version, type_byte]), text(msg_id), text(queue)]
    parts.append(struct.pack(">I", len(payload)) + payload)
    pairs = headers or []
    parts.append(struct.pack(">H", len(pairs)))
    for key, value in pairs:
        parts += [text(key), text(value)]
    return b"".join(parts)


async def assert_still_open(c: RawClient) -> None:
    assert_ok(await c.ping(), T.PONG)


# -- fatal framing errors --------------------------------------------------------------------------


async def test_oversized_frame_length_is_invalid_message_then_closed(world: World) -> None:
    c = await world.bad_client()
    c.send_raw(struct.pack(">I", DEFAULT_MAX_MESSAGE_SIZE + 1) + b"\x01\x14")
    left = await c.wait_closed()
    assert len(left) == 1
    assert_error(left[0], "INVALID_MESSAGE")
    await world.assert_healthy()


async def test_oversized_real_frame_with_small_limit(broker_factory: BrokerFactory) -> None:
    broker = await broker_factory(max_message_size=4096)
    w = await make_world(broker)
    # Exactly at the limit is fine.
    exact = w.witness.publish_msg("kept_not", b'"' + b"x" * 4000 + b'"', msg_id="edge")
    body = encode_body(exact)
    pad = 4096 - len(body)
    exact.payload = b'"' + b"x" * (4000 + pad) + b'"'
    assert len(encode_body(exact)) == 4096
    c = await RawClient.connected(broker.port)
    c.send(exact)
    assert_ok(await c.reply_to("edge"), T.PUBLISH_ACK)
    exact.payload += b" "
    exact.id = "over"
    c.send(exact)
    left = await c.wait_closed()
    assert [m.error_code for m in left] == ["INVALID_MESSAGE"]
    await w.assert_healthy()
    await w.witness.close()


async def test_zero_length_frame_is_invalid_message_then_closed(world: World) -> None:
    c = await world.bad_client()
    c.send_raw(b"\x00\x00\x00\x00")
    left = await c.wait_closed()
    assert len(left) == 1
    assert_error(left[0], "INVALID_MESSAGE")
    await world.assert_healthy()


async def test_good_frames_before_a_fatal_one_are_still_answered(world: World) -> None:
    c = await world.bad_client()
    good = Message(T.PING, "before_fatal")
    c.send_raw(frame(encode_body(good)) + b"\x00\x00\x00\x00")
    left = await c.wait_closed()
    assert len(left) == 2
    assert (left[0].type, left[0].id) == (T.PONG, "before_fatal")
    assert_error(left[1], "INVALID_MESSAGE")
    await world.assert_healthy()


# -- bad bodies: Error for that message, the connection goes on ------------------------------------


async def test_truncated_field_is_invalid_message_and_connection_stays_open(world: World) -> None:
    c = await world.bad_client()
    body = body_of(c.publish_msg("kept", {"x": 1}, {"h": "v"}, msg_id="trunc_1"))
    c.send_raw(frame(bytes(body[:-3])))  # the header value is cut short
    assert_error(await c.reply_to("trunc_1"), "INVALID_MESSAGE", "trunc_1")
    # A payload length that runs past the end of the frame.
    bad = hand_body(T.PUBLISH, b"trunc_2", b"kept", b"{}")
    bad = bad[:-4]  # drop the header count and the payload bytes, keep the payload length
    c.send_raw(frame(bad))
    assert_error(await c.reply_to("trunc_2"), "INVALID_MESSAGE", "trunc_2")
    await assert_still_open(c)
    await world.assert_healthy()


async def test_trailing_garbage_is_invalid_message(world: World) -> None:
    c = await world.bad_client()
    body = encode_body(Message(T.PING, "trail_1")) + b"\x00"
    c.send_raw(frame(body))
    assert_error(await c.reply_to("trail_1"), "INVALID_MESSAGE", "trail_1")
    await assert_still_open(c)
    await world.assert_healthy()


async def test_wrong_version_byte_is_invalid_message(world: World) -> None:
    c = await world.bad_client()
    body = body_of(c.publish_msg("kept", 1, msg_id="ver_2"))
    body[0] = 2
    c.send_raw(frame(bytes(body)))
    assert_error(await c.reply_to("ver_2"), "INVALID_MESSAGE", "ver_2")
    await assert_still_open(c)
    await world.assert_healthy()


@pytest.mark.parametrize("type_byte", [3, 12, 27, 44, 77, 98, 100, 255])
async def test_unknown_type_byte_is_unknown_command(world: World, type_byte: int) -> None:
    c = await world.bad_client()
    c.send_raw(frame(hand_body(type_byte, b"unk_1", b"kept")))
    assert_error(await c.reply_to("unk_1"), "UNKNOWN_COMMAND", "unk_1")
    await assert_still_open(c)
    await world.assert_healthy()


async def test_server_only_command_from_client_is_refused(world: World) -> None:
    c = await world.bad_client()
    reply = await c.request(Message(T.DELIVER, "fake_deliver", "kept", b"1"))
    assert_error(reply, "INVALID_MESSAGE", "fake_deliver")
    await assert_still_open(c)
    await world.assert_healthy()


async def test_missing_id_is_invalid_message(world: World) -> None:
    c = await world.bad_client()
    c.send_raw(frame(hand_body(T.PUBLISH, b"", b"kept", b"1")))
    reply = await c.recv_type(T.ERROR)
    assert_error(reply, "INVALID_MESSAGE")
    await assert_still_open(c)
    await world.assert_healthy()


async def test_invalid_utf8_in_id_is_invalid_message(world: World) -> None:
    c = await world.bad_client()
    c.send_raw(frame(hand_body(T.PUBLISH, b"bad\xff\xfeid", b"kept", b"1")))
    reply = await c.recv_type(T.ERROR)
    assert_error(reply, "INVALID_MESSAGE")  # the id cannot be echoed; some id is still there
    await assert_still_open(c)
    await world.assert_healthy()


@pytest.mark.parametrize(
    "where",
    ["queue", "header-key", "header-value", "payload"],
)
async def test_invalid_utf8_in_fields(world: World, where: str) -> None:
    c = await world.bad_client()
    queue = b"ke\xc3\x28pt" if where == "queue" else b"kept"
    headers = []
    if where == "header-key":
        headers = [(b"k\xff", b"v")]
    elif where == "header-value":
        headers = [(b"k", b"v\xed\xa0\x80")]  # an encoded surrogate is not UTF-8
    payload = b'"\xff"' if where == "payload" else b"1"
    c.send_raw(frame(hand_body(T.PUBLISH, b"utf_1", queue, payload, headers)))
    code = "INVALID_PAYLOAD" if where == "payload" else "INVALID_MESSAGE"
    assert_error(await c.reply_to("utf_1"), code, "utf_1")
    await assert_still_open(c)
    await world.assert_healthy()


@pytest.mark.parametrize("payload", [b"{not json", b"{'a': 1}", b"[1, 2", b"NaNx", b"\x00"])
async def test_invalid_json_payload_is_invalid_payload(world: World, payload: bytes) -> None:
    c = await world.bad_client()
    reply = await c.publish("kept", payload, msg_id="json_1")
    assert_error(reply, "INVALID_PAYLOAD", "json_1")
    await assert_still_open(c)
    await world.assert_healthy()  # nothing was stored from the bad publish


async def test_invalid_json_in_create_queue_payload(world: World) -> None:
    c = await world.bad_client()
    msg = Message(T.CREATE_QUEUE, "cq_json", "newq", b"{oops")
    assert_error(await c.request(msg), "INVALID_PAYLOAD", "cq_json")
    assert_error(await c.queue_info("newq"), "QUEUE_NOT_FOUND")
    await world.assert_healthy()


@pytest.mark.parametrize(
    "name",
    ["bad queue", "bad/queue", "q!", "q\u00e9", "x" * 257, "tab\tq"],
    ids=["space", "slash", "bang", "non-ascii", "257-chars", "tab"],
)
@pytest.mark.parametrize(
    "kind", [T.PUBLISH, T.SUBSCRIBE, T.UNSUBSCRIBE, T.CREATE_QUEUE, T.DELETE_QUEUE, T.QUEUE_INFO]
)
async def test_bad_queue_name_is_invalid_queue(world: World, name: str, kind: CommandType) -> None:
    c = await world.bad_client()
    payload = b"1" if kind is T.PUBLISH else b""
    reply = await c.request(Message(kind, "badq_1", name, payload))
    assert_error(reply, "INVALID_QUEUE", "badq_1")
    await assert_still_open(c)
    assert (await c.list_queues()).json() == ["kept"]  # nothing was created
    await world.assert_healthy()


async def test_queue_name_of_256_chars_is_fine(world: World) -> None:
    c = await world.bad_client()
    name = "a-b_c.D9" * 32
    assert len(name) == 256
    assert_ok(await c.publish(name, 1), T.PUBLISH_ACK)
    await world.assert_healthy()


async def test_publish_without_queue_is_invalid_queue(world: World) -> None:
    c = await world.bad_client()
    reply = await c.request(Message(T.PUBLISH, "noq_1", "", b"1"))
    assert_error(reply, "INVALID_QUEUE", "noq_1")
    await world.assert_healthy()


async def test_51_headers_is_invalid_message(world: World) -> None:
    c = await world.bad_client()
    headers = {f"h{i}": "v" for i in range(51)}
    assert_error(await c.publish("kept", 1, headers, "hdr51"), "INVALID_MESSAGE", "hdr51")
    await assert_still_open(c)
    headers.pop("h50")
    q = new_id("h50q")
    assert_ok(await c.publish(q, 1, headers, "hdr50"), T.PUBLISH_ACK)
    await world.assert_healthy()


async def test_header_value_of_4097_chars_is_invalid_message(world: World) -> None:
    c = await world.bad_client()
    reply = await c.publish("kept", 1, {"big": "v" * 4097}, "hv4097")
    assert_error(reply, "INVALID_MESSAGE", "hv4097")
    # Characters, not bytes: 4096 two-byte characters are fine.
    q = new_id("hvq")
    assert_ok(await c.publish(q, 1, {"big": "\u00e9" * 4096}, "hv4096"), T.PUBLISH_ACK)
    await assert_still_open(c)
    await world.assert_healthy()


# -- timing, limits -------------------------------------------------------------------------------


async def test_half_frame_then_stall_gets_error_and_close(broker_factory: BrokerFactory) -> None:
    broker = await broker_factory(frame_timeout_s=0.5, housekeeping_interval_ms=20)
    w = await make_world(broker)
    c = await RawClient.connected(broker.port)
    whole = frame(encode_body(c.publish_msg("kept", {"half": True}, msg_id="half_1")))
    c.send_raw(whole[: len(whole) // 2])
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    left = await c.wait_closed(timeout=5)
    assert loop.time() - t0 >= 0.4
    assert len(left) == 1
    assert_error(left[0], "INVALID_MESSAGE")
    await w.assert_healthy()
    await w.witness.close()


async def test_idle_connection_gets_keepalive_disconnect(broker_factory: BrokerFactory) -> None:
    broker = await broker_factory(keepalive_timeout_s=0.5, housekeeping_interval_ms=20)
    w = await make_world(broker)

    async def keep_witness_alive() -> None:
        while True:
            w.witness.send(Message(T.PING, new_id("keep")))
            await asyncio.sleep(0.1)

    pinger = asyncio.create_task(keep_witness_alive())
    try:
        idle = await RawClient.connected(broker.port)
        never_connected = await RawClient.open(broker.port)
        for c in (idle, never_connected):
            left = await c.wait_closed(timeout=5)
            assert len(left) == 1, left
            assert left[0].type is T.DISCONNECT
            assert left[0].headers["reason"] == "keepalive_timeout"
        await w.assert_healthy()
    finally:
        pinger.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pinger
    await w.witness.close()


async def test_pinging_client_is_not_disconnected(broker_factory: BrokerFactory) -> None:
    broker = await broker_factory(keepalive_timeout_s=0.5, housekeeping_interval_ms=20)
    c = await RawClient.connected(broker.port)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 1.6
    while loop.time() < deadline:
        assert_ok(await c.ping(), T.PONG)
        await asyncio.sleep(0.2)
    await c.close()


async def test_connection_limit(broker_factory: BrokerFactory) -> None:
    broker = await broker_factory(max_connections=3)
    w = await make_world(broker)
    others = [await RawClient.connected(broker.port) for _ in range(2)]
    fourth = await RawClient.open(broker.port)
    left = await fourth.wait_closed()
    assert len(left) == 1
    assert_error(left[0], "CONNECTION_LIMIT")
    with pytest.raises(Closed):
        await fourth.recv(timeout=1)
    await w.assert_healthy()
    for o in others:
        assert_ok(await o.ping(), T.PONG)
    # A freed slot can be used again.
    await others[0].close()
    async with asyncio.timeout(5):
        while len(broker.connections) > 2:
            await asyncio.sleep(0.01)
    again = await RawClient.connected(broker.port)
    assert_ok(await again.ping(), T.PONG)
    for c in (again, others[1], w.witness):
        await c.close()


async def test_publish_rate_limit(broker_factory: BrokerFactory) -> None:
    broker = await broker_factory(publish_rate_limit=5)
    w = await make_world(broker)  # the witness spent 2 of its own 5 tokens
    c = await RawClient.connected(broker.port)
    ids = [f"burst_{i}" for i in range(20)]
    for mid in ids:
        c.send(c.publish_msg("burst", mid, msg_id=mid))
    replies = {mid: await c.reply_to(mid) for mid in ids}
    limited = [m for m, r in replies.items() if r.type is T.ERROR]
    accepted = [m for m, r in replies.items() if r.type is T.PUBLISH_ACK]
    assert len(limited) + len(accepted) == 20
    assert 1 <= len(accepted) <= 7
    assert len(limited) >= 13
    for mid in limited:
        assert_error(replies[mid], "RATE_LIMITED", mid)
    info = assert_ok(await c.queue_info("burst"), T.QUEUE_INFO).json()
    assert info["messageCount"] == len(accepted)  # type: ignore[index]
    # Other commands are not rate limited, and tokens come back with time.
    assert_ok(await c.ping(), T.PONG)
    await asyncio.sleep(0.25)
    assert_ok(await c.publish("burst", "later"), T.PUBLISH_ACK)
    await w.assert_healthy()
    await c.close()
    await w.witness.close()


async def test_rate_limit_below_one_per_second_still_allows_a_publish(
    broker_factory: BrokerFactory,
) -> None:
    """publish_rate_limit=0.5 means one publish every two seconds, not none at all."""
    broker = await broker_factory(publish_rate_limit=0.5)
    c = await RawClient.connected(broker.port)
    assert_ok(await c.publish("slow", 1, msg_id="slow_1"), T.PUBLISH_ACK)
    assert_error(await c.publish("slow", 2, msg_id="slow_2"), "RATE_LIMITED", "slow_2")
    await c.close()


async def test_steady_stream_of_split_frames_is_not_a_stall(broker_factory: BrokerFactory) -> None:
    """Frames that keep completing are progress: only a frame that stalls may time out,
    even when every TCP chunk happens to end in the middle of the next frame."""
    broker = await broker_factory(frame_timeout_s=0.5, housekeeping_interval_ms=20)
    c = await RawClient.connected(broker.port)
    frames = [frame(encode_body(c.publish_msg("stream", i, msg_id=f"st_{i}"))) for i in range(40)]
    halves = [(f[: len(f) // 2], f[len(f) // 2 :]) for f in frames]
    c.send_raw(halves[0][0])
    for i in range(len(frames) - 1):
        await asyncio.sleep(0.05)  # 40 chunks over ~2 s, each ending mid-frame
        c.send_raw(halves[i][1] + halves[i + 1][0])
    c.send_raw(halves[-1][1])
    for i in range(len(frames)):
        assert_ok(await c.reply_to(f"st_{i}"), T.PUBLISH_ACK)
    await assert_still_open(c)
    await c.close()


async def test_bad_prefetch_is_invalid_message(world: World) -> None:
    c = await world.bad_client()
    for value in ("0", "-1", "abc", "65536"):
        msg = Message(T.SUBSCRIBE, f"pf_{value}", "kept", headers={"prefetch": value})
        assert_error(await c.request(msg), "INVALID_MESSAGE", msg.id)
    await assert_still_open(c)
    await world.assert_healthy()


@pytest.mark.parametrize(
    "payload",
    [b"null", b"0", b'"s"', b"[]", b" {} ", b"123456789012345678901234567890", b'"\\ud83d\\ude00"'],
)
async def test_any_json_value_is_a_valid_payload(world: World, payload: bytes) -> None:
    c = await world.bad_client()
    q = new_id("jsonq")
    assert_ok(await c.subscribe(q), T.SUBSCRIBE_ACK)
    assert_ok(await c.publish(q, payload, msg_id=f"{q}_m"), T.PUBLISH_ACK)
    d = await c.delivery(q)
    assert d.payload == payload  # delivered byte for byte
    await world.assert_healthy()


async def test_deeply_nested_payload_is_invalid_payload_not_a_crash(world: World) -> None:
    c = await world.bad_client()
    reply = await c.publish("kept", b"[" * 100_000 + b"]" * 100_000, msg_id="deep")
    assert_error(reply, "INVALID_PAYLOAD", "deep")
    await assert_still_open(c)
    await world.assert_healthy()


async def test_many_bad_frames_in_one_write(world: World) -> None:
    """One chunk holding good and bad bodies: each gets its own answer, in order."""
    c = await world.bad_client()
    bad_version = bytearray(encode_body(Message(T.PING, "b2")))
    bad_version[0] = 9
    chunk = b"".join(
        [
            frame(encode_body(Message(T.PING, "b1"))),
            frame(bytes(bad_version)),
            frame(hand_body(200, b"b3")),
            frame(hand_body(T.PUBLISH, b"b4", b"kept", b"{x")),
            frame(hand_body(T.PUBLISH, b"b5", b"bad name", b"1")),
            frame(encode_body(Message(T.PING, "b6"))),
        ]
    )
    c.send_raw(chunk)
    got = [await c.recv() for _ in range(6)]
    assert [(m.id, m.type, m.error_code) for m in got] == [
        ("b1", T.PONG, ""),
        ("b2", T.ERROR, "INVALID_MESSAGE"),
        ("b3", T.ERROR, "UNKNOWN_COMMAND"),
        ("b4", T.ERROR, "INVALID_PAYLOAD"),
        ("b5", T.ERROR, "INVALID_QUEUE"),
        ("b6", T.PONG, ""),
    ]
    await world.assert_healthy()
