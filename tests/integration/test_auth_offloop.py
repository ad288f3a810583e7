"""Password hashes are verified off the event loop (issue 13).

A login's scrypt hash runs in a worker thread (``Link.offload``): meanwhile the broker goes on
serving every other connection, and the client's own frames that came right behind its login
wait for the verdict, then run in order, on every protocol. Checked by order of events, not
by time: with a hash made deliberately slow, another connection's round trips all complete
before the slow login's answer arrives.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from amqputil import RawAmqp
from mqttkit import AsyncRawMqtt, RawMqtt, unique_id
from pamqp import commands
from pamqp import frame as pamqp_frame
from rawclient import RawClient

from vibemq_server.adapters.mqtt.packets import Connack, Connect, Publish, Suback, Subscribe
from vibemq_server.auth.passwords import hash_password
from vibemq_server.auth.users import User, UserStore
from vibemq_server.protocol import CommandType, Message, encode
from vibemq_server.server import Broker

HOST = "127.0.0.1"
WAIT = 30.0
#: scrypt at 2^17 (128 MiB, some 0.5 s): long enough that dozens of round trips fit inside it
SLOW_LOG_N = 17


def write_users(path: Path, **passwords: str) -> None:
    store = UserStore(path)
    store.save({name: User(name, hash_password(pw)) for name, pw in passwords.items()})


def write_slow_user(path: Path, name: str, password: str) -> None:
    store = UserStore(path)
    users = store.load()
    users[name] = User(name, hash_password(password, SLOW_LOG_N))
    store.save(users)


async def users_broker(broker_factory: Any, tmp_path: Path) -> Broker:
    path = tmp_path / "users.json"
    write_users(path, alice="alice-pw")
    broker: Broker = await broker_factory(users_file=path, auth_failure_delay_s=0)
    return broker


async def alice(port: int) -> AsyncRawMqtt:
    raw = await AsyncRawMqtt.open(port)
    connack = await raw.connect(unique_id(), username="alice", password=b"alice-pw")
    assert connack.return_code == 0, connack
    return raw


# -- frames that follow a login in the same write --------------------------------------------


async def test_native_frames_behind_a_password_connect_wait_for_it(
    broker_factory: Any, tmp_path: Path
) -> None:
    broker = await users_broker(broker_factory, tmp_path)
    c = await RawClient.open(broker.port)
    try:
        login = Message(
            CommandType.CONNECT, "c1", headers={"username": "alice", "password": "alice-pw"}
        )
        create = Message(CommandType.CREATE_QUEUE, "q1", "offloop.native")
        c.send_raw(b"".join(_encoded(m) for m in (login, create)))
        assert (await c.recv()).type is CommandType.CONNECT_ACK
        reply = await c.reply_to("q1")
        assert reply.type is not CommandType.ERROR, reply
        assert "offloop.native" in broker.manager.queues
    finally:
        await c.close()


async def test_native_frames_behind_a_wrong_password_are_never_run(
    broker_factory: Any, tmp_path: Path
) -> None:
    broker = await users_broker(broker_factory, tmp_path)
    c = await RawClient.open(broker.port)
    login = Message(CommandType.CONNECT, "c1", headers={"username": "alice", "password": "no"})
    create = Message(CommandType.CREATE_QUEUE, "q1", "offloop.refused")
    c.send_raw(b"".join(_encoded(m) for m in (login, create)))
    reply = await c.recv()
    assert reply.error_code == "AUTH_FAILED"
    await c.wait_closed()
    assert "offloop.refused" not in broker.manager.queues


def _encoded(msg: Message) -> bytes:
    return encode(msg)


async def test_mqtt_packets_behind_a_password_connect_wait_for_it(
    broker_factory: Any, tmp_path: Path
) -> None:
    broker = await users_broker(broker_factory, tmp_path)
    assert broker.mqtt_port is not None
    raw = await AsyncRawMqtt.open(broker.mqtt_port)
    try:
        await raw.send(
            Connect(client_id=unique_id(), username="alice", password=b"alice-pw"),
            Subscribe(1, (("offloop/mqtt", 1),)),
            Publish("offloop/mqtt", b"behind the login", qos=1, packet_id=2),
        )
        assert (await raw.expect(Connack)).return_code == 0
        assert (await raw.expect(Suback)).return_codes == (1,)
        delivered = await raw.expect(Publish)
        assert delivered.payload == b"behind the login"
    finally:
        await raw.close()


async def test_mqtt_packets_behind_a_wrong_password_are_never_run(
    broker_factory: Any, tmp_path: Path
) -> None:
    broker = await users_broker(broker_factory, tmp_path)
    assert broker.mqtt_port is not None
    watcher = await alice(broker.mqtt_port)
    try:
        assert await watcher.subscribe("offloop/refused", 0) == 0
        raw = await AsyncRawMqtt.open(broker.mqtt_port)
        await raw.send(
            Connect(client_id=unique_id(), username="alice", password=b"wrong"),
            Publish("offloop/refused", b"must not arrive"),
        )
        assert (await raw.expect(Connack)).return_code == 4
        await raw.wait_closed()
        assert not [p for p in await watcher.barrier() if isinstance(p, Publish)]
    finally:
        await watcher.close()


def _send_pipelined_login(raw: RawAmqp, password: str, **client_properties: Any) -> None:
    """After connection.start: start-ok (alice, PLAIN), tune-ok and open in one write."""
    raw.send(
        b"".join(
            pamqp_frame.marshal(method, 0)
            for method in (
                commands.Connection.StartOk(
                    client_properties={"product": "raw-test", **client_properties},
                    mechanism="PLAIN",
                    response="\x00alice\x00" + password,
                    locale="en_US",
                ),
                commands.Connection.TuneOk(channel_max=16, frame_max=131072, heartbeat=0),
                commands.Connection.Open(virtual_host="/"),
            )
        )
    )


def _amqp_refused_login(port: int) -> list[Any]:
    """A pipelined login with a wrong password; what comes back before the close."""
    raw = RawAmqp(port)
    try:
        raw.start()
        _send_pipelined_login(raw, "wrong", capabilities={"authentication_failure_close": True})
        return [frame for _channel, frame in raw.wait_closed(timeout=5.0)]
    finally:
        raw.close()


async def test_amqp_methods_behind_a_password_start_ok_wait_for_it(
    broker_factory: Any, tmp_path: Path
) -> None:
    broker = await users_broker(broker_factory, tmp_path)
    assert broker.amqp_port is not None
    loop = asyncio.get_running_loop()
    raw = RawAmqp(broker.amqp_port)
    try:
        await loop.run_in_executor(None, raw.start)
        _send_pipelined_login(raw, "alice-pw")
        await loop.run_in_executor(None, raw.expect, commands.Connection.Tune, 0)
        await loop.run_in_executor(None, raw.expect, commands.Connection.OpenOk, 0)
    finally:
        raw.close()


async def test_amqp_methods_behind_a_wrong_password_are_never_run(
    broker_factory: Any, tmp_path: Path
) -> None:
    broker = await users_broker(broker_factory, tmp_path)
    assert broker.amqp_port is not None
    loop = asyncio.get_running_loop()
    frames = await loop.run_in_executor(None, _amqp_refused_login, broker.amqp_port)
    kinds = [type(f) for f in frames]
    assert commands.Connection.Close in kinds
    assert commands.Connection.Tune not in kinds and commands.Connection.OpenOk not in kinds
    close = next(f for f in frames if isinstance(f, commands.Connection.Close))
    assert close.reply_code == 403


# -- the loop goes on while a hash is computed -------------------------------------------------


async def test_other_connections_are_served_while_a_slow_hash_is_verified(
    broker_factory: Any, tmp_path: Path
) -> None:
    """A client logging in with a slow hash gets its CONNACK only after another client's
    round trips, all started after the login, came back: the hash did not hold the loop."""
    path = tmp_path / "users.json"
    write_users(path, alice="alice-pw")
    write_slow_user(path, "slow", "slow-pw")
    broker: Broker = await broker_factory(users_file=path)
    assert broker.mqtt_port is not None
    busy = await alice(broker.mqtt_port)
    try:
        assert await busy.subscribe("offloop/busy", 0) == 0
        loop = asyncio.get_running_loop()
        order: list[str] = []

        def slow_login() -> None:
            raw = RawMqtt(broker.mqtt_port or 0)
            try:
                code = raw.connect(username="slow", password=b"slow-pw").return_code
                order.append(f"connack {code}")
            finally:
                raw.close()

        login = loop.run_in_executor(None, slow_login)
        # wait until the broker has the login in hand (its hash is being computed) ...
        await _wait_for_pending_login(broker)
        # ... then 20 round trips through the broker on another connection
        for n in range(20):
            await busy.send(Publish("offloop/busy", str(n).encode()))
            delivered = await busy.expect(Publish)
            assert delivered.payload == str(n).encode()
        order.append("round trips done")
        await asyncio.wait_for(login, WAIT)
        assert order == ["round trips done", "connack 0"]
    finally:
        await busy.close()


async def _wait_for_pending_login(broker: Broker) -> None:
    """Until an MQTT connection is waiting for its password's verdict (bounded)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while True:
        pending = [
            conn
            for conn in broker.connections
            if getattr(_protocol_session(conn), "_authenticating", False)
        ]
        if pending:
            return
        assert loop.time() < deadline, "the slow login never reached the broker"
        await asyncio.sleep(0.005)


def _protocol_session(conn: Any) -> Any:
    """The protocol's session of a transport: an MQTT socket's first session (MqttEntry) reads
    the CONNECT's protocol level and hands over to that version's connection (``conn``, which
    replaces it as the transport's session)."""
    session = getattr(conn, "session", None)
    return getattr(session, "conn", None) or session
