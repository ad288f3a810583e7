"""Issue 16: a big native payload's JSON check runs off the loop (protocol/jsoncheck.py).

From ``OFFLOAD_FROM`` bytes a Publish's payload is checked in a worker thread; the frames the
same connection sent after it wait for the verdict, so replies and deliveries keep the frames'
order, a bad big payload gets INVALID_PAYLOAD and the connection goes on, and another
connection is served meanwhile (its round-trip time is bench/bigmsg_pingpong.py's).
"""

from __future__ import annotations

from typing import Any

from rawclient import RawClient, assert_error, assert_ok, new_id

from vibemq_server.protocol import CommandType
from vibemq_server.protocol.jsoncheck import COMPILED, OFFLOAD_FROM

T = CommandType
TIMEOUT = 60.0  # a 5 MiB check and journal write on a busy machine
SIZE = OFFLOAD_FROM + 1024 * 1024


def big_json(fill: bytes = b"a") -> bytes:
    """A JSON array holding one long string: SIZE bytes."""
    return b'["' + fill * (SIZE - 4) + b'"]'


def test_big_payloads_are_checked_off_the_loop() -> None:
    assert COMPILED, "build it: pip install -e . or scripts/build_ext.sh"
    assert len(big_json()) >= OFFLOAD_FROM


async def test_a_big_publish_and_the_small_ones_after_it_keep_their_order(broker: Any) -> None:
    pub = await RawClient.connected(broker.port)
    sub = await RawClient.connected(broker.port)
    witness = await RawClient.connected(broker.port)
    queue = new_id("order")
    try:
        assert_ok(await sub.create_queue(queue), T.CREATE_QUEUE)
        assert_ok(await sub.subscribe(queue, prefetch=100), T.SUBSCRIBE_ACK)
        bad = big_json()
        bad = bad[: SIZE // 2] + b"\xff" + bad[SIZE // 2 + 1 :]  # not UTF-8, deep inside
        sent = [
            pub.publish_msg(queue, big_json(), msg_id="big_1"),
            pub.publish_msg(queue, {"n": 1}, msg_id="small_1"),
            pub.publish_msg(queue, {"n": 2}, msg_id="small_2"),
            pub.publish_msg(queue, bad, msg_id="bad_big"),
            pub.publish_msg(queue, {"n": 3}, msg_id="small_3"),
            pub.publish_msg(queue, big_json(b"b"), msg_id="big_2"),
            pub.publish_msg(queue, {"n": 4}, msg_id="small_4"),
        ]
        for msg in sent:  # pipelined: nothing waits for a reply
            pub.send(msg)
        # another connection is served while the big ones are being checked and stored
        assert_ok(await witness.ping(), T.PONG)

        replies = [await pub.recv(timeout=TIMEOUT) for _ in sent]
        assert [(r.type, r.id) for r in replies] == [
            (T.PUBLISH_ACK, "big_1"),
            (T.PUBLISH_ACK, "small_1"),
            (T.PUBLISH_ACK, "small_2"),
            (T.ERROR, "bad_big"),
            (T.PUBLISH_ACK, "small_3"),
            (T.PUBLISH_ACK, "big_2"),
            (T.PUBLISH_ACK, "small_4"),
        ]
        assert_error(replies[3], "INVALID_PAYLOAD", "bad_big")

        got = await sub.deliveries(6, queue, timeout=TIMEOUT)
        assert [d.id for d in got] == ["big_1", "small_1", "small_2", "small_3", "big_2", "small_4"]
        assert got[0].payload == big_json() and got[4].payload == big_json(b"b")
        assert [d.json() for d in (got[1], got[2], got[3], got[5])] == [
            {"n": 1},
            {"n": 2},
            {"n": 3},
            {"n": 4},
        ]
        assert_ok(await pub.ping(), T.PONG)  # the connection goes on
    finally:
        for c in (pub, sub, witness):
            await c.close()
