"""Permissions (issue 13, item 3), enforced on MQTT: RabbitMQ-style write/read regexes per
user over the shared address space, set with ``vibemq-server users permit``, with
``%u``/``%c`` substitution; a refused SUBSCRIBE filter gets 0x80, a refused PUBLISH (and
will) is acknowledged and dropped, and nothing another protocol publishes reaches a
subscriber who may not read it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pika
import pytest
from amqputil import pika_params
from mqttkit import RawMqtt
from rawclient import RawClient
from serverproc import clean_env
from userskit import add_user, users
from waits import wait_until
from zmqutil import ZMQ_FLAGS, ZmqPeer, start_server

from vibemq_server.adapters.mqtt.packets import Puback, Publish
from vibemq_server.protocol import CommandType, Message
from vibemq_server.server import Broker


def permit(path: Path, name: str, **patterns: str) -> None:
    flags = [f"--{kind}={pattern}" for kind, pattern in patterns.items()]
    done = users(path, "permit", name, *flags)
    assert done.returncode == 0, done.stderr


def amqp_login(port: int, user: str) -> pika.BlockingConnection:
    """pika as ``user`` (password ``<user>-pw``, as add_user gave it), timeouts bounded."""
    return pika.BlockingConnection(
        pika_params(port, credentials=pika.PlainCredentials(user, f"{user}-pw"))
    )


def login(port: int, user: str, client_id: str | None = None, **fields: Any) -> RawMqtt:
    raw = RawMqtt(port)
    connack = raw.connect(client_id, username=user, password=f"{user}-pw".encode(), **fields)
    assert connack.return_code == 0
    return raw


async def test_mqtt_read_and_write_permissions(broker_factory: Any, tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    for name in ("alice", "admin"):
        add_user(path, name, f"{name}-pw")
    permit(path, "alice", write=r"^(%u|public)\.", read=r"^(%u|public)\.|^inbox\.%c$")
    broker: Broker = await broker_factory(users_file=path)
    port = broker.mqtt_port
    assert port is not None
    loop = asyncio.get_running_loop()

    def scenario() -> None:
        alice = login(port, "alice", "dev1")
        admin = login(port, "admin")
        try:
            for topic_filter, granted in [
                ("alice/in/#", 1),
                ("public/+", 1),
                ("inbox/dev1", 1),  # %c: her own client id's inbox
                ("inbox/dev2", 0x80),
                ("secret/#", 0x80),
                ("#", 0x80),  # a filter wider than what she may read
                ("bob/x", 0x80),
            ]:
                assert alice.subscribe(topic_filter, 1) == granted, topic_filter
            assert admin.subscribe("#", 0) == 0

            # Her publish where she may not write is acknowledged (3.1.1 has no refusal)
            # and reaches nobody.
            alice.send(Publish("secret/x", b"leak", qos=1, packet_id=7))
            assert alice.expect(Puback).packet_id == 7
            alice.send(Publish("alice/x", b"mine", qos=1, packet_id=8))
            assert alice.expect(Puback).packet_id == 8
            got = [p for p in admin.barrier(0.3) if isinstance(p, Publish)]
            assert [(p.topic, p.payload) for p in got] == [("alice/x", b"mine")]
        finally:
            alice.disconnect()
            admin.disconnect()

    await loop.run_in_executor(None, scenario)


async def test_nothing_reaches_a_subscriber_who_may_not_read(
    broker_factory: Any, tmp_path: Path
) -> None:
    """Cross-protocol: a VibeMQ publish to an address reaches only MQTT subscribers whose
    user may read it (their subscriptions were refused), and a will follows the rules."""
    path = tmp_path / "users.json"
    add_user(path, "carol", "carol-pw")
    add_user(path, "admin", "admin-pw")
    permit(path, "carol", write="^carol\\.", read="^open\\.")
    broker: Broker = await broker_factory(users_file=path, auth_tokens=["tok:admin"])
    port = broker.mqtt_port
    assert port is not None
    loop = asyncio.get_running_loop()
    carol = await loop.run_in_executor(None, login, port, "carol")
    admin = await loop.run_in_executor(None, login, port, "admin")
    try:
        assert await loop.run_in_executor(None, carol.subscribe, "open/#", 0) == 0
        assert await loop.run_in_executor(None, carol.subscribe, "closed/#", 0) == 0x80
        assert await loop.run_in_executor(None, admin.subscribe, "#", 0) == 0
        native = await RawClient.connected(broker.port, token="tok")
        for address in ("closed.x", "open.x"):
            reply = await native.publish(address, {"a": address})
            assert reply.type is CommandType.PUBLISH_ACK
        got = await loop.run_in_executor(None, carol.barrier, 0.3)
        assert [p.topic for p in got if isinstance(p, Publish)] == ["open/x"]
        await native.close()

        # A will at a topic carol may not write is not published when she drops.
        will_owner = await loop.run_in_executor(
            None,
            lambda: login(port, "carol", will_topic="closed/will", will_payload=b"w"),
        )
        will_owner.close()
        got = await loop.run_in_executor(None, admin.barrier, 0.3)
        assert [p.topic for p in got if isinstance(p, Publish)] == ["closed/x", "open/x"]
    finally:
        carol.disconnect()
        admin.disconnect()


async def test_native_permissions(broker_factory: Any, tmp_path: Path) -> None:
    """VibeMQ: NOT_AUTHORIZED for a publish, subscribe, queue info or queue creation/deletion
    the user may not do; the connection stays open. A token bound to a user carries the
    user's permissions."""
    path = tmp_path / "users.json"
    add_user(path, "dave", "dave-pw")
    permit(path, "dave", configure="^%u\\.(own|q)$", write="^%u\\.", read="^%u\\.")
    broker: Broker = await broker_factory(users_file=path, auth_tokens=["dave-tok:dave"])
    for connect in ("token", "password"):
        if connect == "token":
            c = await RawClient.connected(broker.port, token="dave-tok")
        else:
            c = await RawClient.open(broker.port)
            reply = await c.request(
                Message(
                    CommandType.CONNECT, "c1", headers={"username": "dave", "password": "dave-pw"}
                )
            )
            assert reply.type is CommandType.CONNECT_ACK
        assert (await c.publish("dave.q", {"n": 1})).type is CommandType.PUBLISH_ACK
        assert (await c.subscribe("dave.q")).type is CommandType.SUBSCRIBE_ACK
        for reply in (
            await c.publish("other.q", {"n": 1}),
            await c.subscribe("other.q"),
            await c.queue_info("other.q"),
            await c.create_queue("dave.q2"),
            await c.delete_queue("dave.q2"),
        ):
            assert reply.type is CommandType.ERROR and reply.error_code == "NOT_AUTHORIZED"
            assert "refused for user 'dave'" in (reply.error_message or "")
        created = await c.create_queue("dave.own")
        assert created.type is not CommandType.ERROR or created.error_code == "QUEUE_EXISTS"
        assert (await c.ping()).type is CommandType.PONG  # still open
        await c.close()


async def test_amqp_permissions(broker_factory: Any, tmp_path: Path) -> None:
    """AMQP, RabbitMQ's table: channel.close 403 in RabbitMQ's words for each refused
    method; the connection and its other channels go on."""
    path = tmp_path / "users.json"
    add_user(path, "erin", "erin-pw")
    permit(path, "erin", configure="^erin\\.", write="^(erin\\.|amq\\.default$)", read="^erin\\.")
    broker: Broker = await broker_factory(users_file=path)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, amqp_scenario, broker.amqp_port)


def amqp_scenario(port: int | None) -> None:
    assert port is not None
    conn = amqp_login(port, "erin")
    try:
        ch = conn.channel()
        ch.queue_declare("erin.q")
        ch.basic_publish("", "erin.q", b"hi")
        got: list[bytes] = []

        def fetch() -> bool:
            method, _props, body = ch.basic_get("erin.q", auto_ack=True)
            if method is not None:
                got.append(body)
            return bool(got)

        wait_until(fetch, "erin's own message")
        assert got == [b"hi"]
        refused = {
            "declare": lambda c: c.queue_declare("other.q"),
            "delete": lambda c: c.queue_delete("other.q"),
            "get": lambda c: c.basic_get("other.q"),
            "consume": lambda c: c.basic_consume("other.q", lambda *a: None),
            "purge": lambda c: c.queue_purge("other.q"),
            "publish": lambda c: (c.confirm_delivery(), c.basic_publish("amq.topic", "x", b"")),
            "bind": lambda c: c.queue_bind("erin.q", "amq.topic", "erin.#"),
            "exchange": lambda c: c.exchange_declare("other.x", "fanout"),
        }
        words = {
            "declare": "queue 'other.q'",
            "delete": "queue 'other.q'",
            "get": "queue 'other.q'",
            "consume": "queue 'other.q'",
            "purge": "queue 'other.q'",
            "publish": "exchange 'amq.topic'",
            "bind": "exchange 'amq.topic'",
            "exchange": "exchange 'other.x'",
        }
        for name, action in refused.items():
            channel = conn.channel()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
                action(channel)
            assert info.value.reply_code == 403, name
            assert info.value.reply_text == (
                f"ACCESS_REFUSED - access to {words[name]} in vhost '/' refused for user 'erin'"
            ), name
        # The first channel is untouched; passive declares need nothing.
        assert ch.queue_declare("erin.q", passive=True).method.message_count == 0
        assert conn.is_open
    finally:
        conn.close()


async def test_zmq_pull_publishes_as_its_configured_user(tmp_path: Path) -> None:
    """ZeroMQ has no login: PULL publishes as ``zmq.user``, whose write permission applies
    (a refused message is dropped with a warning)."""
    path = tmp_path / "users.json"
    add_user(path, "zed", "zed-pw")
    permit(path, "zed", write="^(open\\.|\\.probe$)")  # (.probe: the helper's probes)
    srv = await start_server(
        tmp_path, *ZMQ_FLAGS, "--users-file", str(path), env=clean_env(VIBEMQ_ZMQ__USER="zed")
    )
    peer = ZmqPeer(srv)
    try:
        sub = await peer.sub(b"")
        push = peer.push()
        await push.send_multipart([b"closed.a", b"no"])
        await push.send_multipart([b"open.a", b"yes"])
        assert await peer.recv(sub) == [b"open.a", b"yes"]  # (in order: closed.a was dropped)
    finally:
        peer.close()
        assert await srv.stop() == 0
    dropped = [
        e for e in srv.log_events() if e.get("event") == "zmq message dropped: no write permission"
    ]
    assert [(e["address"], e["user"]) for e in dropped] == [("closed.a", "zed")]


async def test_zmq_sub_peers_read_as_the_configured_user(tmp_path: Path) -> None:
    """SUB peers have no login either: the PUB side sends only addresses ``zmq.user`` may
    read, whatever their prefix."""
    path = tmp_path / "users.json"
    add_user(path, "zed", "zed-pw")
    permit(path, "zed", write=".*", read="^open\\.|\\.probe$")  # (.probe: the helper's)
    srv = await start_server(
        tmp_path, *ZMQ_FLAGS, "--users-file", str(path), env=clean_env(VIBEMQ_ZMQ__USER="zed")
    )
    peer = ZmqPeer(srv)
    try:
        sub = await peer.sub(b"")
        push = peer.push()
        await push.send_multipart([b"closed.a", b"no"])
        await push.send_multipart([b"open.a", b"yes"])
        assert await peer.recv(sub) == [b"open.a", b"yes"]  # (in order: closed.a not sent)
        closed = await peer.sub(b"closed.")
        await push.send_multipart([b"closed.b", b"no"])
        await push.send_multipart([b"open.b", b"yes"])
        assert await peer.recv(sub) == [b"open.b", b"yes"]
        await peer.nothing(closed)
    finally:
        peer.close()
        assert await srv.stop() == 0


async def test_amqp_cannot_reach_addresses_other_protocols_would_refuse(
    broker_factory: Any, tmp_path: Path
) -> None:
    """The default exchange and amq.topic lead into the shared address space: their routing
    and binding keys are checked as addresses (RabbitMQ's topic permissions for amq.topic)."""
    path = tmp_path / "users.json"
    add_user(path, "fay", "fay-pw")
    permit(
        path,
        "fay",
        configure="^fay\\.",
        write="^(fay\\.|amq\\.topic$|amq\\.default$)",
        read="^(fay\\.|amq\\.topic$)",
    )
    broker: Broker = await broker_factory(users_file=path)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, amqp_address_scenario, broker.amqp_port)


def amqp_address_scenario(port: int | None) -> None:
    assert port is not None
    conn = amqp_login(port, "fay")
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("fay.q")
        ch.queue_bind("fay.q", "amq.topic", "fay.#")
        ch.basic_publish("amq.topic", "fay.x", b"via-topic")
        ch.basic_publish("", "fay.q", b"direct")
        got: list[bytes] = []

        def fetch() -> bool:
            method, _props, body = ch.basic_get("fay.q", auto_ack=True)
            if method is not None:
                got.append(body)
            return len(got) == 2

        wait_until(fetch, "fay's two messages")
        assert sorted(got) == [b"direct", b"via-topic"]
        refused = {
            "bind": (
                lambda c: c.queue_bind("fay.q", "amq.topic", "secret.#"),
                "topic 'secret.#' in exchange 'amq.topic'",
            ),
            "topic publish": (
                lambda c: (c.confirm_delivery(), c.basic_publish("amq.topic", "secret.x", b"")),
                "topic 'secret.x' in exchange 'amq.topic'",
            ),
            "default publish": (
                lambda c: (c.confirm_delivery(), c.basic_publish("", "secret.q", b"")),
                "queue 'secret.q'",
            ),
        }
        for name, (action, words) in refused.items():
            channel = conn.channel()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
                action(channel)
            assert (info.value.reply_code, info.value.reply_text) == (
                403,
                f"ACCESS_REFUSED - access to {words} in vhost '/' refused for user 'fay'",
            ), name
    finally:
        conn.close()


# -- permission changes reach open connections and resumed sessions ----------------------------


async def test_a_permission_change_applies_to_open_connections(
    broker_factory: Any, tmp_path: Path
) -> None:
    """The users file changes under a connected client: its next publish is judged by the new
    patterns, and once its user is deleted it may do nothing more."""
    path = tmp_path / "users.json"
    add_user(path, "alice", "alice-pw")
    permit(path, "alice", configure=".*", write=".*", read=".*")
    broker: Broker = await broker_factory(users_file=path)
    c = await RawClient.open(broker.port)
    try:
        reply = await c.request(
            Message(
                CommandType.CONNECT, "c1", headers={"username": "alice", "password": "alice-pw"}
            )
        )
        assert reply.type is CommandType.CONNECT_ACK
        assert (await c.publish("live.a", b"1")).type is CommandType.PUBLISH_ACK
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, lambda: permit(path, "alice", write=r"^other\."))
        broker.reload()
        refused = await c.publish("live.a", b"2")
        assert refused.error_code == "NOT_AUTHORIZED", refused
        await loop.run_in_executor(None, lambda: users(path, "delete", "alice"))
        broker.reload()
        assert (await c.publish("other.x", b"3")).error_code == "NOT_AUTHORIZED"
    finally:
        await c.close()


async def test_a_resumed_mqtt_session_loses_filters_its_user_may_no_longer_read(
    broker_factory: Any, tmp_path: Path
) -> None:
    path = tmp_path / "users.json"
    for name in ("alice", "admin"):
        add_user(path, name, f"{name}-pw")
    broker: Broker = await broker_factory(users_file=path)
    port = broker.mqtt_port
    assert port is not None
    loop = asyncio.get_running_loop()

    def subscribe_then_leave() -> None:
        alice = login(port, "alice", "dev-keep", clean_session=False)
        assert alice.subscribe("secret/#", 1) == 1
        assert alice.subscribe("public/#", 1) == 1
        alice.disconnect()

    await loop.run_in_executor(None, subscribe_then_leave)
    await loop.run_in_executor(None, lambda: permit(path, "alice", read=r"^public\."))
    broker.reload()

    def resume_and_listen() -> list[tuple[str, bytes]]:
        alice = login(port, "alice", "dev-keep", clean_session=False)
        admin = login(port, "admin")
        try:
            admin.send(Publish("secret/x", b"no", qos=1, packet_id=1))
            admin.expect(Puback)
            admin.send(Publish("public/x", b"yes", qos=1, packet_id=2))
            admin.expect(Puback)
            got = [p for p in alice.barrier(0.5) if isinstance(p, Publish)]
            return [(p.topic, p.payload) for p in got]
        finally:
            alice.disconnect()
            admin.disconnect()

    assert await loop.run_in_executor(None, resume_and_listen) == [("public/x", b"yes")]
