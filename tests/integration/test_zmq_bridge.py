"""The ZeroMQ bridge against a real ``vibemq-server`` process, with real pyzmq PUSH and SUB
sockets, and the VibeMQ client, paho-mqtt and pika on the other side (docs/zmq.md)."""

from __future__ import annotations

import asyncio
import base64
import json
import queue
from collections.abc import AsyncIterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pika
import pytest
from amqputil import get_message
from serverproc import clean_env, server_args
from zmqutil import WAIT, ZMQ_FLAGS, Server, ZmqPeer, start_server

from vibemq_server.client import Client, decode_multipart
from vibemq_server.protocol import mme
from vibemq_server.protocol.mme import MME_CONTENT_TYPE

PARTS = [b"part-1", b"", b"\x00\xff binary", b"x" * 300]


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    srv = await start_server(tmp_path, *ZMQ_FLAGS)
    yield srv
    assert await srv.stop() == 0


@pytest.fixture
async def peer(server: Server) -> AsyncIterator[ZmqPeer]:
    p = ZmqPeer(server)
    yield p
    p.close()


def events(srv: Server, name: str) -> list[dict[str, object]]:
    return [e for e in srv.log_events() if e.get("event") == name]


async def test_ready_file_reports_bound_endpoints(server: Server) -> None:
    for key in ("zmq_pull", "zmq_pub"):
        endpoint = server.ports[key]
        assert endpoint.startswith("tcp://127.0.0.1:")
        assert int(endpoint.rsplit(":", 1)[1]) > 0


async def test_bridge_is_off_by_default(tmp_path: Path) -> None:
    srv = await start_server(tmp_path)
    try:
        assert "zmq_pull" not in srv.ports
    finally:
        assert await srv.stop() == 0


async def test_endpoints_from_the_environment(tmp_path: Path) -> None:
    env = clean_env(VIBEMQ_ZMQ__PULL="tcp://127.0.0.1:0", VIBEMQ_ZMQ__PUB="tcp://127.0.0.1:0")
    srv = await start_server(tmp_path, env=env)
    peer = ZmqPeer(srv)
    try:
        sub = await peer.sub(b"env.")
        await peer.push().send_multipart([b"env.a", b"1", b"2"])
        assert await peer.recv(sub) == [b"env.a", b"1", b"2"]
    finally:
        peer.close()
        assert await srv.stop() == 0


async def test_bind_failure_is_a_clean_exit(tmp_path: Path) -> None:
    srv = await start_server(tmp_path, *ZMQ_FLAGS)
    try:
        busy = srv.pull  # already bound by the first server
        proc = await asyncio.create_subprocess_exec(
            *server_args(tmp_path / "data2", tmp_path / "r2.json", "--zmq-pull", busy),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env=clean_env(),
        )
        _out, err = await asyncio.wait_for(proc.communicate(), 15)
        assert proc.returncode == 1
        assert b"ZeroMQ bind failed" in err
    finally:
        assert await srv.stop() == 0


async def test_push_reaches_sub_as_the_same_parts(peer: ZmqPeer) -> None:
    sub = await peer.sub(b"zt.")
    push = peer.push()
    await push.send_multipart([b"zt.a", *PARTS])
    assert await peer.recv(sub) == [b"zt.a", *PARTS]
    await push.send_multipart([b"zt.none"])  # zero parts
    assert await peer.recv(sub) == [b"zt.none"]
    big = [b"y" * 70_000, b"z"]
    await push.send_multipart([b"zt.big", *big])
    assert await peer.recv(sub) == [b"zt.big", *big]


async def test_sub_gets_only_its_prefixes(peer: ZmqPeer) -> None:
    a = await peer.sub(b"pa.")
    b = await peer.sub(b"pb.")
    push = peer.push()
    for i in range(20):
        await push.send_multipart([b"pa.x" if i % 2 else b"pb.y", b"%d" % i])
    got_a = [await peer.recv(a) for _ in range(10)]
    got_b = [await peer.recv(b) for _ in range(10)]
    assert got_a == [[b"pa.x", b"%d" % i] for i in range(1, 20, 2)]
    assert got_b == [[b"pb.y", b"%d" % i] for i in range(0, 20, 2)]
    await peer.nothing(a, 0.2)


async def test_vibemq_subscriber_decodes_multipart(server: Server, peer: ZmqPeer) -> None:
    async with await Client.connect("127.0.0.1", server.port) as client:
        sub = await client.subscribe("zorders")  # creates the queue: the push goes into it
        await peer.push().send_multipart([b"zorders", *PARTS])
        msg = await sub.get(WAIT)
        await msg.ack()
    assert msg.headers["contentType"] == MME_CONTENT_TYPE
    assert msg.headers["payloadEncoding"] == "base64"
    assert msg.is_multipart
    assert base64.b64decode(msg.payload) == mme.encode(PARTS)
    assert decode_multipart(msg) == PARTS


async def test_push_to_an_address_without_queue_creates_none(server: Server, peer: ZmqPeer) -> None:
    sub = await peer.sub(b"noq.")
    await peer.push().send_multipart([b"noq.x", b"1"])
    assert await peer.recv(sub) == [b"noq.x", b"1"]
    async with await Client.connect("127.0.0.1", server.port) as client:
        assert "noq.x" not in await client.list_queues()


async def test_publish_multipart_reaches_sub_as_parts(server: Server, peer: ZmqPeer) -> None:
    sub = await peer.sub(b"zjobs")
    async with await Client.connect("127.0.0.1", server.port) as client:
        await client.publish_multipart("zjobs", PARTS)
        assert await peer.recv(sub) == [b"zjobs", *PARTS]
        await client.publish_multipart("zjobs", [])
        assert await peer.recv(sub) == [b"zjobs"]
        # Not multipart: one part, the JSON text.
        await client.publish("zjobs", {"id": 42})
        assert await peer.recv(sub) == [b"zjobs", b'{"id":42}']
        # And back: a VibeMQ subscriber gets what publish_multipart sent.
        vsub = await client.subscribe("zjobs2")
        await client.publish_multipart("zjobs2", [b"a", b"b"], headers={"trace": "t1"})
        msg = await vsub.get(WAIT)
        assert decode_multipart(msg) == [b"a", b"b"]
        assert msg.headers["trace"] == "t1"
        await client.publish("zjobs2", {"id": 43})
        plain = await vsub.get(WAIT)
        assert not plain.is_multipart
        assert decode_multipart(plain) == [b'{"id":43}']


async def test_malformed_multipart_from_vibemq_is_one_part(server: Server, peer: ZmqPeer) -> None:
    sub = await peer.sub(b"zbad")
    bad = b"\x05ab"  # a frame of 5 octets with 2 following
    headers = {"contentType": MME_CONTENT_TYPE, "payloadEncoding": "base64"}
    async with await Client.connect("127.0.0.1", server.port) as client:
        await client.publish("zbad", base64.b64encode(bad).decode(), headers=headers)
        assert await peer.recv(sub) == [b"zbad", bad]
        await client.publish_multipart("zbad", [b"still", b"fine"])
        assert await peer.recv(sub) == [b"zbad", b"still", b"fine"]
    await server.stop()
    assert events(server, "malformed multipart body sent as one part")


async def test_bad_address_is_dropped_with_a_log_line(server: Server, peer: ZmqPeer) -> None:
    sub = await peer.sub(b"")
    push = peer.push()
    await push.send_multipart([b"\xff\xfe", b"x"])  # not UTF-8
    await push.send_multipart([b"", b"x"])  # empty
    await push.send_multipart([b"ok", b"x"])
    assert await peer.recv(sub) == [b"ok", b"x"]
    await server.stop()
    dropped = events(server, "zmq message dropped: the first frame is not an address")
    assert len(dropped) == 1  # throttled: one line, the next one counts it as suppressed


def _paho(port: int, topic: str) -> tuple[mqtt.Client, queue.Queue[mqtt.MQTTMessage]]:
    got: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
    subscribed: queue.Queue[int] = queue.Queue()
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
    client.on_message = lambda _c, _u, m: got.put(m)
    client.on_subscribe = lambda _c, _u, mid, _rc, _p: subscribed.put(mid)
    client.connect("127.0.0.1", port)
    client.loop_start()
    client.subscribe(topic, qos=1)
    subscribed.get(timeout=WAIT)
    return client, got


async def test_mqtt_gets_mme_bytes_and_mqtt_reaches_sub(server: Server, peer: ZmqPeer) -> None:
    client, got = await asyncio.to_thread(_paho, server.ports["mqtt"], "zm/+")
    try:
        await peer.push().send_multipart([b"zm.a", *PARTS])
        msg = await asyncio.to_thread(got.get, True, WAIT)
        assert msg.topic == "zm/a"
        assert msg.payload == mme.encode(PARTS)
        # MQTT -> ZeroMQ: a payload is one part, its exact bytes.
        sub = await peer.sub(b"zm.")
        info = client.publish("zm/b", b"\x00\x01raw", qos=1)
        await asyncio.to_thread(info.wait_for_publish, WAIT)
        assert await peer.recv(sub) == [b"zm.b", b"\x00\x01raw"]
    finally:
        client.loop_stop()
        client.disconnect()


def _amqp_roundtrip(port: int) -> tuple[bytes, str | None, dict[str, object] | None]:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    try:
        _method, props, body = get_message(conn.channel(), "zamqp", timeout=WAIT)
        return body, props.content_type, props.headers
    finally:
        conn.close()


def _amqp_declare_and_publish(port: int) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    try:
        ch = conn.channel()
        ch.queue_declare("zamqp", durable=True)
        props = pika.BasicProperties(content_type=MME_CONTENT_TYPE)
        ch.basic_publish("", "zamqp.out", mme.encode([b"from", b"amqp"]), props)
        ch.basic_publish("", "zamqp.out", b"\x09broken", props)
        ch.basic_publish("", "zamqp.out", b"plain", pika.BasicProperties())
    finally:
        conn.close()


async def test_amqp_both_ways(server: Server, peer: ZmqPeer) -> None:
    port = server.ports["amqp"]
    sub = await peer.sub(b"zamqp.out")
    await asyncio.to_thread(_amqp_declare_and_publish, port)
    assert await peer.recv(sub) == [b"zamqp.out", b"from", b"amqp"]
    assert await peer.recv(sub) == [b"zamqp.out", b"\x09broken"]  # malformed: one part
    assert await peer.recv(sub) == [b"zamqp.out", b"plain"]
    await peer.push().send_multipart([b"zamqp", *PARTS])
    body, content_type, _headers = await asyncio.to_thread(_amqp_roundtrip, port)
    assert body == mme.encode(PARTS)
    assert content_type == MME_CONTENT_TYPE


async def test_pushed_message_in_durable_queue_survives_restart(tmp_path: Path) -> None:
    srv = await start_server(tmp_path, *ZMQ_FLAGS)
    try:
        async with await Client.connect("127.0.0.1", srv.port) as client:
            await client.create_queue("zdurable")
            peer = ZmqPeer(srv)
            try:
                await peer.push().send_multipart([b"zdurable", b"keep", b"me"])
                async with asyncio.timeout(WAIT):
                    while (await client.queue_info("zdurable"))["messageCount"] < 1:
                        await asyncio.sleep(0.02)
            finally:
                peer.close()
    finally:
        assert await srv.stop() == 0
    srv = await start_server(tmp_path, *ZMQ_FLAGS)
    try:
        async with await Client.connect("127.0.0.1", srv.port) as client:
            sub = await client.subscribe("zdurable")
            msg = await sub.get(WAIT)
            assert decode_multipart(msg) == [b"keep", b"me"]
            await msg.ack()
    finally:
        assert await srv.stop() == 0


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def test_slow_sub_does_not_make_the_broker_buffer(tmp_path: Path) -> None:
    env = clean_env(VIBEMQ_ZMQ__SNDHWM="10")
    srv = await start_server(tmp_path, *ZMQ_FLAGS, env=env)
    peer = ZmqPeer(srv)
    try:
        slow = await peer.sub(b"flood", RCVHWM=10, RCVBUF=65536)
        push = peer.push()
        rss_before = _rss_kib(srv.proc.pid)
        chunk = b"f" * 10_000
        count = 4000  # 40 MB through a SUB that does not read
        for _ in range(count):
            await push.send_multipart([b"flood", chunk])
        fast = await peer.sub(b"flood.done")  # the bridge got through the flood
        await push.send_multipart([b"flood.done", b"end"])
        assert await peer.recv(fast) == [b"flood.done", b"end"]
        grown_mib = (_rss_kib(srv.proc.pid) - rss_before) / 1024
        assert grown_mib < 25, f"broker grew {grown_mib:.1f} MiB for a slow SUB"
        received = 0
        while True:
            try:
                frames = await peer.recv(slow, 0.3)
            except TimeoutError:
                break
            received += frames[0] == b"flood"
        assert 0 < received < count  # the high-water mark dropped the rest
    finally:
        peer.close()
        assert await srv.stop() == 0


def test_config_file_and_flags(tmp_path: Path) -> None:
    from vibemq_server.cli import build_parser, config_from_args

    path = tmp_path / "z.toml"
    path.write_text('[zmq]\npull = "tcp://127.0.0.1:7001"\nsndhwm = 5\n')
    args = build_parser().parse_args(["--config", str(path), "--zmq-pub", "ipc:///tmp/x"])
    cfg = config_from_args(args, {"VIBEMQ_ZMQ__RCVHWM": "7"})
    assert (cfg.zmq.pull, cfg.zmq.pub, cfg.zmq.sndhwm, cfg.zmq.rcvhwm) == (
        "tcp://127.0.0.1:7001",
        "ipc:///tmp/x",
        5,
        7,
    )
    assert cfg.zmq.enabled
    assert not config_from_args(build_parser().parse_args([]), {}).zmq.enabled
    assert json.loads(json.dumps(cfg.zmq.model_dump()))["batch"] == 256


async def test_message_over_max_size_is_dropped(tmp_path: Path) -> None:
    srv = await start_server(tmp_path, *ZMQ_FLAGS, "--max-message-size", "1000")
    peer = ZmqPeer(srv)
    try:
        sub = await peer.sub(b"big")
        push = peer.push()
        await push.send_multipart([b"big", b"a" * 400, b"b" * 400, b"c" * 400])  # MME: 1203
        await push.send_multipart([b"big", b"a" * 400, b"b" * 400])  # 802: fits
        assert await peer.recv(sub) == [b"big", b"a" * 400, b"b" * 400]
    finally:
        peer.close()
        assert await srv.stop() == 0
    assert events(srv, "zmq message dropped: over max_message_size")
