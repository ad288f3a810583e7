"""RabbitMQ behaviours real clients rely on, each checked against rabbitmq-server 3.10 (Debian's,
started as bench/brokers.py starts it) and asserted here with RabbitMQ's own reply texts:

* auto-delete exchanges go only when they lose their last binding as source (aio-pika's two
  exchanges bound to each other; aio-pika's RPC pattern and its auto-delete ``rpc.dlx``);
* a queue redeclared with other arguments (present on one side only, or other values) is a
  406 worded as RabbitMQ words it, with the wire type of the value; new queues' arguments are
  validated with RabbitMQ's texts; exclusivity must match (405);
* an unknown exchange type closes the connection with 503 COMMAND_INVALID;
* connection.update-secret checks the new secret (530 NOT_ALLOWED when refused);
* a refused login: connection.close 403 with RabbitMQ's text to clients announcing
  ``authentication_failure_close``, a silent close for the others.

Real clients (pika, aio-pika, raw frames for what they cannot send) over loopback; the broker
is a real one on its own thread (:class:`amqputil.AmqpBroker`).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aio_pika
import aiormq.exceptions
import pika
import pika.exceptions
import pytest
from aio_pika.patterns import RPC
from amqputil import (
    WAIT,
    AmqpBroker,
    PikaClients,
    RawAmqp,
    RawClients,
    frame,
    method_payload,
    roundtrip_ok,
)
from pamqp import commands
from waits import wait_until

pytestmark = pytest.mark.timeout(60)

Q = "parity-q"


def url(amqp: AmqpBroker, user: str = "guest", password: str = "guest") -> str:
    return f"amqp://{user}:{password}@127.0.0.1:{amqp.amqp_port}/"


# --------------------------------------------------------------------------------------------
# Auto-delete exchanges


async def test_aio_pika_two_auto_delete_exchanges_bound_to_each_other(amqp: AmqpBroker) -> None:
    conn = await aio_pika.connect(url(amqp), timeout=WAIT)
    try:
        channel = await conn.channel()
        first = await channel.declare_exchange("ad-first", auto_delete=True)
        second = await channel.declare_exchange("ad-second", auto_delete=True)
        await second.bind(first, "k")  # destination second, source first
        queue = await channel.declare_queue("ad-pair-q")
        await queue.bind(second, "k")
        # Both are there, and a publish to the first goes through the second.
        await channel.declare_exchange("ad-first", passive=True)
        await channel.declare_exchange("ad-second", passive=True)
        await first.publish(aio_pika.Message(b"through"), "k")
        got = await queue.get(no_ack=True, timeout=WAIT)
        assert got.body == b"through"
        # Unbinding takes the first (its last binding as source), never the second.
        await second.unbind(first, "k")
        assert not amqp.has_exchange("ad-first")
        assert amqp.has_exchange("ad-second")
    finally:
        await conn.close()


async def test_aio_pika_rpc_pattern(amqp: AmqpBroker) -> None:
    """aio_pika.patterns.RPC: an auto-delete headers exchange ``rpc.dlx`` bound to an
    auto-delete, server-named result queue; the call queues dead-letter to it."""
    conn = await aio_pika.connect(url(amqp), timeout=WAIT)
    try:
        server = await RPC.create(await conn.channel())
        caller = await RPC.create(await conn.channel())

        async def multiply(*, x: int, y: int) -> int:
            return x * y

        await server.register("multiply", multiply, auto_delete=True)
        assert await asyncio.wait_for(caller.proxy.multiply(x=6, y=7), WAIT) == 42
        assert await asyncio.wait_for(caller.call("multiply", {"x": 3, "y": 5}), WAIT) == 15
        # A call nobody takes in time is dead-lettered through rpc.dlx back to its caller,
        # which sees it as a timeout (RPC.on_result_message).
        channel = await conn.channel()
        await channel.declare_queue("unserved", arguments={"x-dead-letter-exchange": "rpc.dlx"})
        with pytest.raises(asyncio.TimeoutError, match="Message timed-out"):
            await asyncio.wait_for(caller.call("unserved", {}, expiration=1), WAIT)
        # Closing unbinds each result queue: rpc.dlx goes with its last binding, and a new
        # RPC declares it again.
        assert amqp.has_exchange("rpc.dlx")
        await caller.close()
        assert amqp.has_exchange("rpc.dlx")  # the server's result queue is still bound
        await server.close()
        assert not amqp.has_exchange("rpc.dlx")
        again = await RPC.create(await conn.channel())
        await again.register("multiply", multiply, auto_delete=True)
        assert await asyncio.wait_for(again.proxy.multiply(x=2, y=21), WAIT) == 42
    finally:
        await conn.close()


# --------------------------------------------------------------------------------------------
# Queue redeclaration: the arguments RabbitMQ compares, and its wording

# (key, first value, other value, the wire type pika sends the first as)
COMPARED: list[tuple[str, Any, Any, str]] = [
    ("x-expires", 60000, 70000, "signedint"),
    ("x-message-ttl", 1000, 2000, "signedint"),
    ("x-dead-letter-exchange", "dlx", "dlx2", "longstr"),
    ("x-dead-letter-routing-key", "rk", "rk2", "longstr"),
    ("x-max-length", 10, 20, "signedint"),
    ("x-max-length-bytes", 1000, 2000, "signedint"),
    ("x-max-priority", 5, 6, "signedint"),
    ("x-overflow", "reject-publish", "drop-head", "longstr"),
    ("x-queue-mode", "lazy", "default", "longstr"),
    ("x-single-active-consumer", True, False, "bool"),
    ("x-queue-master-locator", "min-masters", "random", "longstr"),
]


def shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def expected_406(key: str, received: str, current: str, queue: str = Q) -> str:
    return (
        f"PRECONDITION_FAILED - inequivalent arg '{key}' for queue '{queue}' in vhost '/': "
        f"received {received} but current is {current}"
    )


def redeclare_error(
    conn: pika.BlockingConnection,
    first: dict[str, Any],
    second: dict[str, Any],
    queue: str = Q,
    **flags: bool,
) -> tuple[int, str] | None:
    """Declare ``queue`` with ``first``, redeclare it with ``second`` (and ``flags``) on
    another channel: the channel error, or None when the redeclare was accepted."""
    conn.channel().queue_declare(queue, arguments=first)
    channel = conn.channel()
    try:
        channel.queue_declare(queue, arguments=second, **flags)
    except pika.exceptions.ChannelClosedByBroker as err:
        return err.reply_code, err.reply_text
    finally:
        cleanup = conn.channel()
        cleanup.queue_delete(queue)
        cleanup.close()
    return None


@pytest.mark.parametrize(("key", "first", "other", "kind"), COMPARED, ids=[c[0] for c in COMPARED])
def test_redeclare_with_other_arguments_is_406(
    amqp: AmqpBroker, clients: PikaClients, key: str, first: Any, other: Any, kind: str
) -> None:
    conn = clients.connect(amqp.amqp_port)
    # x-dead-letter-routing-key needs a dead-letter exchange on both sides.
    base = {"x-dead-letter-exchange": "dlx"} if key == "x-dead-letter-routing-key" else {}
    with_first, with_other = {**base, key: first}, {**base, key: other}
    typed = f"the value '{shown(first)}' of type '{kind}'"
    assert redeclare_error(conn, base, with_first) == (406, expected_406(key, typed, "none"))
    assert redeclare_error(conn, with_first, base) == (406, expected_406(key, "none", typed))
    assert redeclare_error(conn, with_first, with_other) == (
        406,
        expected_406(key, f"'{shown(other)}'", f"'{shown(first)}'"),
    )
    assert redeclare_error(conn, with_first, with_first) is None
    roundtrip_ok(conn, "still-fine")


def test_redeclare_texts_are_rabbitmqs(amqp: AmqpBroker, clients: PikaClients) -> None:
    """Reply texts exactly as rabbitmq-server 3.10 gave them for the same declares."""
    conn = clients.connect(amqp.amqp_port)
    assert redeclare_error(conn, {}, {"x-max-length": 10}, "q1") == (
        406,
        "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'q1' in vhost '/': "
        "received the value '10' of type 'signedint' but current is none",
    )
    assert redeclare_error(conn, {"x-message-ttl": 1000}, {}, "q5") == (
        406,
        "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'q5' in vhost '/': "
        "received none but current is the value '1000' of type 'signedint'",
    )
    assert redeclare_error(conn, {"x-dead-letter-exchange": "dlx"}, {}, "q8") == (
        406,
        "PRECONDITION_FAILED - inequivalent arg 'x-dead-letter-exchange' for queue 'q8' in "
        "vhost '/': received none but current is the value 'dlx' of type 'longstr'",
    )
    assert redeclare_error(
        conn, {"x-overflow": "reject-publish"}, {"x-overflow": "drop-head"}, "q18"
    ) == (
        406,
        "PRECONDITION_FAILED - inequivalent arg 'x-overflow' for queue 'q18' in vhost '/': "
        "received 'drop-head' but current is 'reject-publish'",
    )
    # The first difference in RabbitMQ's order is the one named (x-message-ttl before
    # x-max-length, whatever the table's order).
    assert redeclare_error(
        conn,
        {"x-max-length": 10, "x-message-ttl": 5},
        {"x-max-length": 11, "x-message-ttl": 6},
        "q48",
    ) == (
        406,
        "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'q48' in vhost '/': "
        "received '6' but current is '5'",
    )


def test_arguments_rabbitmq_does_not_compare(amqp: AmqpBroker, clients: PikaClients) -> None:
    conn = clients.connect(amqp.amqp_port)
    assert redeclare_error(conn, {"x-foo": "bar"}, {"x-foo": "baz"}) is None
    assert redeclare_error(conn, {}, {"x-foo": "bar"}) is None
    # A missing x-queue-type is "classic".
    assert redeclare_error(conn, {}, {"x-queue-type": "classic"}) is None
    assert redeclare_error(conn, {"x-queue-type": "classic"}, {}) is None
    assert redeclare_error(conn, {"x-queue-type": "classic"}, {"x-queue-type": "quorum"}) == (
        406,
        expected_406("x-queue-type", "'quorum'", "'classic'"),
    )


def test_redeclare_flags(amqp: AmqpBroker, clients: PikaClients) -> None:
    conn = clients.connect(amqp.amqp_port)
    assert redeclare_error(conn, {}, {}, durable=True) == (
        406,
        expected_406("durable", "'true'", "'false'"),
    )
    assert redeclare_error(conn, {}, {}, auto_delete=True) == (
        406,
        expected_406("auto_delete", "'true'", "'false'"),
    )
    locked = (
        405,
        f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{Q}' in vhost '/'. "
        "It could be originally declared on another connection or the exclusive property "
        "value does not match that of the original declaration.",
    )
    assert redeclare_error(conn, {}, {}, exclusive=True) == locked
    # Declared exclusive, redeclared not exclusive by its own connection: locked too.
    conn.channel().queue_declare("mine", exclusive=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        conn.channel().queue_declare("mine")
    assert (info.value.reply_code, info.value.reply_text) == (
        405,
        locked[1].replace(f"'{Q}'", "'mine'"),
    )
    # An exclusive queue is transient whatever durable says (so both declares agree).
    channel = conn.channel()
    channel.queue_declare("excl-durable", exclusive=True, durable=True)
    channel.queue_declare("excl-durable", exclusive=True, durable=True)
    channel.queue_declare("excl-durable", exclusive=True)
    assert not amqp.queue_durable("excl-durable")


async def test_aio_pika_argument_types(amqp: AmqpBroker, clients: PikaClients) -> None:
    """aio-pika (pamqp) sends the smallest integer type: RabbitMQ names it in the text, and
    integers of different wire types but equal values are equivalent."""
    conn = await aio_pika.connect(url(amqp), timeout=WAIT)
    try:
        cases = [
            ("x-max-length", 10, "byte"),
            ("x-message-ttl", 1000, "short"),
            ("x-expires", 60000, "unsignedshort"),
            ("x-max-length-bytes", 100000, "signedint"),
        ]
        for number, (key, value, kind) in enumerate(cases):
            name = f"aio-types-{number}"
            await (await conn.channel()).declare_queue(name)
            with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed) as info:
                await (await conn.channel()).declare_queue(name, arguments={key: value})
            typed = f"the value '{value}' of type '{kind}'"
            assert info.value.args[0] == expected_406(key, typed, "none", name)
        # pika's signedint 10 and aio-pika's byte 10 are the same argument.
        clients.connect(amqp.amqp_port).channel().queue_declare(
            "mixed-types", arguments={"x-max-length": 10}
        )
        await (await conn.channel()).declare_queue("mixed-types", arguments={"x-max-length": 10})
    finally:
        await conn.close()


def raw_declare(client: RawAmqp, channel: int, queue: str, table: bytes) -> None:
    """queue.declare with a hand-built argument table (wire types pika cannot choose)."""
    args = struct.pack(">HB", 0, len(queue)) + queue.encode() + b"\x00" + table
    client.send(frame(1, channel, method_payload(50, 10, args)))


def table(*items: tuple[str, bytes]) -> bytes:
    body = b"".join(struct.pack(">B", len(k)) + k.encode() + v for k, v in items)
    return struct.pack(">I", len(body)) + body


def longstr(value: bytes, tag: bytes = b"S") -> bytes:
    return tag + struct.pack(">I", len(value)) + value


_I5 = b"I" + struct.pack(">i", 5)
_I10 = b"I" + struct.pack(">i", 10)

# (argument, first value, second value, None when equivalent or the 406's "received ...")
WIRE_CASES: dict[str, tuple[str, bytes, bytes, str | None]] = {
    # Integers of any width are one class.
    "byte-long": ("x-max-length", b"b\x0a", b"l" + struct.pack(">q", 10), None),
    # A double is not an integer, even of the same value.
    "int-double": (
        "x-message-ttl",
        _I5,
        b"d" + struct.pack(">d", 5.0),
        "received '5.0' but current is '5'",
    ),
    # A longstr and a binary of the same bytes are the same value.
    "longstr-binary": ("x-dead-letter-exchange", longstr(b"dlx"), longstr(b"dlx", b"x"), None),
    # A number and a string never are, however alike they print.
    "int-string": ("x-max-length", _I10, longstr(b"10"), "received '10' but current is '10'"),
    "bool-int": (
        "x-single-active-consumer",
        b"t\x01",
        b"I" + struct.pack(">i", 1),
        "received '1' but current is 'true'",
    ),
}


@pytest.mark.parametrize("case", list(WIRE_CASES))
def test_raw_wire_types(amqp: AmqpBroker, raw: RawClients, case: str) -> None:
    key, first, second, error = WIRE_CASES[case]
    client = raw(amqp.amqp_port)
    client.handshake()
    client.open_channel(1)
    raw_declare(client, 1, "wire-q", table((key, first)))
    client.expect(commands.Queue.DeclareOk, 1)
    raw_declare(client, 1, "wire-q", table((key, second)))
    if error is None:
        client.expect(commands.Queue.DeclareOk, 1)
        return
    close = client.expect(commands.Channel.Close, 1)
    assert (close.reply_code, close.class_id, close.method_id) == (406, 50, 10)
    assert close.reply_text == (
        f"PRECONDITION_FAILED - inequivalent arg '{key}' for queue 'wire-q' in vhost '/': " + error
    )


def test_durable_queue_arguments_keep_their_types_across_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    args = {"x-max-length": 10, "x-dead-letter-exchange": "dlx", "x-queue-mode": "lazy"}
    first = AmqpBroker(data).start()
    try:

        async def declare() -> None:
            conn = await aio_pika.connect(url(first), timeout=WAIT)
            try:
                await (await conn.channel()).declare_queue("kept", durable=True, arguments=args)
            finally:
                await conn.close()

        asyncio.run(declare())
    finally:
        first.stop()
    second = AmqpBroker(data).start()
    pikas = PikaClients()
    try:
        conn = pikas.connect(second.amqp_port)
        conn.channel().queue_declare("kept", durable=True, arguments=args)  # the same: fine
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            conn.channel().queue_declare("kept", durable=True, arguments={"x-max-length": 10})
        assert info.value.reply_text == expected_406(
            "x-dead-letter-exchange", "none", "the value 'dlx' of type 'longstr'", "kept"
        )
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            without_max = {k: v for k, v in args.items() if k != "x-max-length"}
            conn.channel().queue_declare("kept", durable=True, arguments=without_max)
        # aio-pika sent 10 as a byte; the restored queue still says so.
        assert info.value.reply_text == expected_406(
            "x-max-length", "none", "the value '10' of type 'byte'", "kept"
        )
    finally:
        pikas.close_all()
        second.stop()


INVALID: dict[str, tuple[dict[str, Any], str]] = {
    # RabbitMQ 3.10's texts for the same declares of a new queue 'bad'
    "negative": (
        {"x-max-length": -1},
        "invalid arg 'x-max-length' for queue 'bad' in vhost '/': {value_negative,-1}",
    ),
    "not an integer": (
        {"x-max-length": "x"},
        "invalid arg 'x-max-length' for queue 'bad' in "
        "vhost '/': \"expected integer, got longstr\"",
    ),
    "overflow": (
        {"x-overflow": "nope"},
        "invalid arg 'x-overflow' for queue 'bad' in vhost '/': invalid_overflow",
    ),
    "routing key without exchange": (
        {"x-dead-letter-routing-key": "rk"},
        "invalid arg 'x-dead-letter-routing-key' for queue 'bad' in vhost '/': "
        "routing_key_but_no_dlx_defined",
    ),
    "priority": (
        {"x-max-priority": 256},
        "invalid arg 'x-max-priority' for queue 'bad' in vhost '/': {max_value_exceeded,256}",
    ),
    "expires": (
        {"x-expires": 0},
        "invalid arg 'x-expires' for queue 'bad' in vhost '/': {value_zero,0}",
    ),
    "exchange name type": (
        {"x-dead-letter-exchange": 5},
        "invalid type 'signedint' for arg 'x-dead-letter-exchange' in queue 'bad' in vhost '/'",
    ),
}


@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_arguments_of_a_new_queue(
    amqp: AmqpBroker, clients: PikaClients, case: str
) -> None:
    args, text = INVALID[case]
    conn = clients.connect(amqp.amqp_port)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        conn.channel().queue_declare("bad", arguments=args)
    assert (info.value.reply_code, info.value.reply_text) == (406, "PRECONDITION_FAILED - " + text)
    assert not amqp.has_queue("bad")


# --------------------------------------------------------------------------------------------
# Unknown exchange types


def test_unknown_exchange_type_closes_the_connection(
    amqp: AmqpBroker, clients: PikaClients, raw: RawClients
) -> None:
    conn = clients.connect(amqp.amqp_port)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        conn.channel().exchange_declare("ext", "x-consistent-hash")
    assert (info.value.reply_code, info.value.reply_text) == (
        503,
        "COMMAND_INVALID - unknown exchange type 'x-consistent-hash'",
    )
    wait_until(lambda: amqp.amqp_connections() == 0, "the connection to close")
    assert not amqp.has_exchange("ext")
    client = raw(amqp.amqp_port)
    client.handshake()
    client.open_channel(1)
    client.method(1, commands.Exchange.Declare(exchange="ext", exchange_type=""))
    close = client.expect_connection_close(503)
    assert (close.class_id, close.method_id) == (40, 10)
    assert close.reply_text == "COMMAND_INVALID - unknown exchange type ''"
    # A passive declare does not look at the type: the exchange is just not there.
    other = clients.connect(amqp.amqp_port)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as missing:
        other.channel().exchange_declare("ext", "fanout2", passive=True)
    assert (missing.value.reply_code, missing.value.reply_text) == (
        404,
        "NOT_FOUND - no exchange 'ext' in vhost '/'",
    )


async def test_aio_pika_unknown_exchange_type(amqp: AmqpBroker) -> None:
    conn = await aio_pika.connect(url(amqp), timeout=WAIT)
    try:
        channel = await conn.channel()
        with pytest.raises(aiormq.exceptions.ConnectionCommandInvalid):
            await channel.declare_exchange("ext", "x-delayed-message")  # type: ignore[arg-type]
    finally:
        await conn.close()


# --------------------------------------------------------------------------------------------
# connection.update-secret


def test_update_secret(brokers: Callable[..., AmqpBroker], clients: PikaClients) -> None:
    amqp = brokers(users={"alice": "pw"}, auth_tokens=["token-1:alice", "token-2:bob"])
    conn = clients.connect(amqp.amqp_port, credentials=pika.PlainCredentials("alice", "pw"))
    conn.update_secret("token-1", "rotated")  # a token bound to alice is a secret of hers
    conn.update_secret("pw", "back")
    roundtrip_ok(conn, "secret-q")
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        conn.update_secret("token-2", "rotated")  # bob's is not
    assert (info.value.reply_code, info.value.reply_text) == (
        530,
        "NOT_ALLOWED - New secret was refused by one of the backends",
    )
    conn = clients.connect(amqp.amqp_port, credentials=pika.PlainCredentials("alice", "pw"))
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        conn.update_secret("wrong", "rotated")
    assert (info.value.reply_code, info.value.reply_text) == (
        530,
        "NOT_ALLOWED - New secret was refused by one of the backends",
    )


def test_update_secret_raw(brokers: Callable[..., AmqpBroker], raw: RawClients) -> None:
    amqp = brokers(users={"alice": "pw"})
    client = raw(amqp.amqp_port)
    client.handshake(username="alice", password="pw")
    client.method(0, commands.Connection.UpdateSecret(new_secret="pw", reason="r"))
    client.expect(commands.Connection.UpdateSecretOk, 0)
    client.method(0, commands.Connection.UpdateSecret(new_secret="nope", reason="r"))
    close = client.expect_connection_close(530)
    assert (close.class_id, close.method_id) == (10, 70)


async def test_aio_pika_update_secret(brokers: Callable[..., AmqpBroker]) -> None:
    amqp = brokers()  # anonymous guest: any secret is fine (RabbitMQ's internal backend's)
    conn = await aio_pika.connect(url(amqp), timeout=WAIT)
    try:
        await conn.update_secret("anything", reason="rotate", timeout=WAIT)
        channel = await conn.channel()
        await channel.declare_queue("after-secret")
    finally:
        await conn.close()


# --------------------------------------------------------------------------------------------
# Refused logins


def start_ok(client: RawAmqp, password: str, capabilities: dict[str, Any]) -> None:
    client.start()
    client.method(
        0,
        commands.Connection.StartOk(
            client_properties={"capabilities": capabilities},
            mechanism="PLAIN",
            response=f"\x00alice\x00{password}",
            locale="en_US",
        ),
    )


def test_refused_login_with_authentication_failure_close(
    brokers: Callable[..., AmqpBroker], raw: RawClients
) -> None:
    amqp = brokers(users={"alice": "pw"})
    client = raw(amqp.amqp_port)
    start_ok(client, "wrong", {"authentication_failure_close": True})
    close = client.expect_connection_close(403)
    assert (close.class_id, close.method_id) == (0, 0)
    assert close.reply_text == (
        "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
        "For details see the broker logfile."
    )


def test_refused_login_without_the_capability_is_a_silent_close(
    brokers: Callable[..., AmqpBroker], raw: RawClients
) -> None:
    amqp = brokers(users={"alice": "pw"})
    client = raw(amqp.amqp_port)
    start_ok(client, "wrong", {})
    frames = client.wait_closed(timeout=WAIT)  # RabbitMQ waits 3 s, then drops the socket
    assert frames == []
    wait_until(lambda: amqp.amqp_connections() == 0, "the refused connection to go")
