"""Send RabbitMQ and VibeMQ the same AMQP frames and compare what comes back.

    python -m bench.amqp_parity [--all] [--rabbitmq-port N] [--vibemq-port N]

Starts a private rabbitmq-server (bench/setup-peers.sh installs it) and a vibemq-server from
this checkout (``python -m vibemq_server``, user ``guest``/``guest`` configured so that logins
are checked), each on free loopback ports, unless their ports are given. Each case opens fresh
connections, sends raw frames (so the wire types of argument tables are exactly chosen) and
records every reply: the method, channel, reply code, class/method ids and reply text of
channel.close / connection.close, or EOF / silence. The report lists the cases whose replies
differ (``--all``: every case). The differences docs/amqp.md names as deliberate are expected
to show up; anything else is a parity bug.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

from pamqp import commands as C
from pamqp import frame as pamqp_frame
from pamqp.heartbeat import Heartbeat

from bench.brokers import RabbitMQBroker, VibeMQBroker

HOST = "127.0.0.1"
WAIT = 4.0  # RabbitMQ closes a refused, capability-less login after 3 s


class Raw:
    """A blocking AMQP client of raw frames; every read is bounded."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=WAIT)
        self.buf = b""

    def send(self, data: bytes) -> None:
        with contextlib.suppress(OSError):
            self.sock.sendall(data)

    def method(self, channel: int, method: Any) -> None:
        self.send(pamqp_frame.marshal(method, channel))

    def reply(self, timeout: float = WAIT) -> str:
        """The next frame (heartbeats skipped) as text, "EOF" or "SILENCE"."""
        deadline = time.monotonic() + timeout
        while True:
            if len(self.buf) >= 7:
                size = int.from_bytes(self.buf[3:7], "big")
                if len(self.buf) >= size + 8:
                    used, channel, value = pamqp_frame.unmarshal(self.buf[: size + 8])
                    self.buf = self.buf[used:]
                    if isinstance(value, Heartbeat):
                        continue
                    if isinstance(value, C.Channel.Close | C.Connection.Close):
                        ids = f"[{value.class_id},{value.method_id}]"
                        return (
                            f"{value.name} ch{channel} {value.reply_code} {ids} {value.reply_text}"
                        )
                    return f"{value.name} ch{channel}"
            left = deadline - time.monotonic()
            if left <= 0:
                return "SILENCE"
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                return "SILENCE"
            except OSError:
                chunk = b""
            if not chunk:
                return "EOF"
            self.buf += chunk

    def rpc(self, method: Any, channel: int = 1) -> str:
        self.method(channel, method)
        return self.reply()

    def start_ok(
        self, password: str, capabilities: dict[str, Any], mechanism: str = "PLAIN"
    ) -> None:
        self.send(b"AMQP\x00\x00\x09\x01")
        self.reply()  # connection.start
        self.method(
            0,
            C.Connection.StartOk(
                client_properties={"capabilities": capabilities},
                mechanism=mechanism,
                response=f"\x00guest\x00{password}",
                locale="en_US",
            ),
        )

    def open(self) -> Raw:
        self.start_ok("guest", {"authentication_failure_close": True})
        assert self.reply().startswith("Connection.Tune"), "no tune"
        self.method(0, C.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0))
        self.method(0, C.Connection.Open(virtual_host="/"))
        assert self.reply().startswith("Connection.OpenOk"), "no open-ok"
        assert self.rpc(C.Channel.Open()).startswith("Channel.OpenOk"), "no channel"
        return self

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


# -- argument tables with chosen wire types ----------------------------------------------------


def _long(tag: bytes, value: bytes) -> bytes:
    return tag + struct.pack(">I", len(value)) + value


WIRE: dict[str, Callable[[Any], bytes]] = {
    "S": lambda v: _long(b"S", v.encode()),
    "x": lambda v: _long(b"x", v),
    "I": lambda v: b"I" + struct.pack(">i", v),
    "b": lambda v: b"b" + struct.pack(">b", v),
    "s": lambda v: b"s" + struct.pack(">h", v),
    "u": lambda v: b"u" + struct.pack(">H", v),
    "l": lambda v: b"l" + struct.pack(">q", v),
    "d": lambda v: b"d" + struct.pack(">d", v),
    "t": lambda v: b"t" + bytes([v]),
}

Arg = tuple[str, str, Any]  # (key, wire tag, value)


def table(args: list[Arg]) -> bytes:
    body = b"".join(
        struct.pack(">B", len(key)) + key.encode() + WIRE[tag](value) for key, tag, value in args
    )
    return struct.pack(">I", len(body)) + body


def declare(
    client: Raw, queue: str, args: list[Arg], *, durable: bool = False, exclusive: bool = False
) -> str:
    bits = durable << 1 | exclusive << 2
    payload = struct.pack(">HHHB", 50, 10, 0, len(queue)) + queue.encode() + bytes([bits])
    payload += table(args)
    client.send(struct.pack(">BHI", 1, 1, len(payload)) + payload + b"\xce")
    return client.reply()


# -- the cases ---------------------------------------------------------------------------------

Case = Callable[[Callable[[], Raw]], list[str]]
CASES: dict[str, Case] = {}


def redeclare_case(first: list[Arg], second: list[Arg], **flags: bool) -> Case:
    def run(connect: Callable[[], Raw]) -> list[str]:
        client = connect()
        queue = "parity-q"
        out = [declare(client, queue, first), declare(client, queue, second, **flags)]
        cleanup = connect()
        cleanup.rpc(C.Queue.Delete(queue=queue))
        return out

    return run


COMPARED: list[tuple[str, str, Any, Any]] = [
    ("x-expires", "I", 60000, 70000),
    ("x-message-ttl", "I", 1000, 2000),
    ("x-dead-letter-exchange", "S", "dlx", "dlx2"),
    ("x-max-length", "I", 10, 20),
    ("x-max-length-bytes", "I", 1000, 2000),
    ("x-max-priority", "I", 5, 6),
    ("x-overflow", "S", "reject-publish", "drop-head"),
    ("x-queue-mode", "S", "lazy", "default"),
    ("x-queue-version", "I", 1, 2),
    ("x-single-active-consumer", "t", 1, 0),
    ("x-queue-master-locator", "S", "min-masters", "random"),
    ("x-queue-type", "S", "classic", "quorum"),
    ("x-foo", "S", "bar", "baz"),
]
for key, tag, one, other in COMPARED:
    CASES[f"redeclare {key}: absent -> present"] = redeclare_case([], [(key, tag, one)])
    CASES[f"redeclare {key}: present -> absent"] = redeclare_case([(key, tag, one)], [])
    CASES[f"redeclare {key}: other value"] = redeclare_case([(key, tag, one)], [(key, tag, other)])
_DLX = ("x-dead-letter-exchange", "S", "d")
CASES["redeclare x-dead-letter-routing-key added"] = redeclare_case(
    [_DLX], [_DLX, ("x-dead-letter-routing-key", "S", "k")]
)
for name, first, second in [
    ("byte 10 -> long 10", ("x-max-length", "b", 10), ("x-max-length", "l", 10)),
    ("short 300 absent", None, ("x-max-length", "s", 300)),
    ("unsignedshort absent", None, ("x-max-length", "u", 40000)),
    ("signedint 5 -> double 5.0", ("x-message-ttl", "I", 5), ("x-message-ttl", "d", 5.0)),
    (
        "longstr -> binary",
        ("x-dead-letter-exchange", "S", "a"),
        ("x-dead-letter-exchange", "x", b"a"),
    ),
    ("signedint 10 -> longstr '10'", ("x-max-length", "I", 10), ("x-max-length", "S", "10")),
    (
        "bool -> signedint",
        ("x-single-active-consumer", "t", 1),
        ("x-single-active-consumer", "I", 1),
    ),
]:
    CASES[f"wire types: {name}"] = redeclare_case(
        [first] if first else [], [second] if second else []
    )
CASES["redeclare durable"] = redeclare_case([], [], durable=True)
CASES["redeclare exclusive"] = redeclare_case([], [], exclusive=True)
CASES["two differences: RabbitMQ's order"] = redeclare_case(
    [("x-max-length", "I", 10), ("x-message-ttl", "I", 5)],
    [("x-max-length", "I", 11), ("x-message-ttl", "I", 6)],
)

for name, arg in [
    ("negative x-max-length", ("x-max-length", "I", -1)),
    ("x-max-length as a string", ("x-max-length", "S", "x")),
    ("x-message-ttl as a double", ("x-message-ttl", "d", 5.0)),
    ("x-expires 0", ("x-expires", "I", 0)),
    ("x-max-priority 256", ("x-max-priority", "I", 256)),
    ("unknown x-overflow", ("x-overflow", "S", "nope")),
    ("routing key without exchange", ("x-dead-letter-routing-key", "S", "k")),
    ("x-dead-letter-exchange as an integer", ("x-dead-letter-exchange", "I", 5)),
]:

    def _invalid(connect: Callable[[], Raw], arg: Arg = arg) -> list[str]:
        return [declare(connect(), "parity-bad", [arg])]

    CASES[f"invalid argument: {name}"] = _invalid


def _case(name: str) -> Callable[[Case], Case]:
    def register(fn: Case) -> Case:
        CASES[name] = fn
        return fn

    return register


@_case("exclusive queue redeclared non-exclusive by its owner")
def _exclusive_owner(connect: Callable[[], Raw]) -> list[str]:
    client = connect()
    return [declare(client, "parity-ex", [], exclusive=True), declare(client, "parity-ex", [])]


@_case("exclusive queue redeclared durable by its owner")
def _exclusive_durable(connect: Callable[[], Raw]) -> list[str]:
    client = connect()
    first = declare(client, "parity-exd", [], exclusive=True)
    return [first, declare(client, "parity-exd", [], exclusive=True, durable=True)]


for kind in ["foo", "fanout2", "x-consistent-hash", ""]:

    def _exchange_type(connect: Callable[[], Raw], kind: str = kind) -> list[str]:
        return [connect().rpc(C.Exchange.Declare(exchange="parity-x", exchange_type=kind))]

    CASES[f"exchange type {kind!r}"] = _exchange_type
CASES["exchange type 'foo', passive"] = lambda connect: [
    connect().rpc(C.Exchange.Declare(exchange="parity-x", exchange_type="foo", passive=True))
]


def _exists(connect: Callable[[], Raw], name: str) -> str:
    reply = connect().rpc(C.Exchange.Declare(exchange=name, passive=True))
    return f"{name}: " + ("exists" if "DeclareOk" in reply else "gone")


def _ad(client: Raw, name: str) -> str:
    return client.rpc(C.Exchange.Declare(exchange=name, exchange_type="direct", auto_delete=True))


@_case("auto-delete: two exchanges bound to each other, then unbound")
def _ad_pair(connect: Callable[[], Raw]) -> list[str]:
    c = connect()
    out = [_ad(c, "ad-a"), _ad(c, "ad-b")]
    out.append(c.rpc(C.Exchange.Bind(destination="ad-b", source="ad-a", routing_key="k")))
    out += [_exists(connect, "ad-a"), _exists(connect, "ad-b")]
    out.append(c.rpc(C.Exchange.Unbind(destination="ad-b", source="ad-a", routing_key="k")))
    return [*out, _exists(connect, "ad-a"), _exists(connect, "ad-b")]


@_case("auto-delete: destination exchange deleted")
def _ad_dest_deleted(connect: Callable[[], Raw]) -> list[str]:
    c = connect()
    out = [_ad(c, "ad-c"), _ad(c, "ad-d")]
    out.append(c.rpc(C.Exchange.Bind(destination="ad-d", source="ad-c")))
    out.append(c.rpc(C.Exchange.Delete(exchange="ad-d")))
    return [*out, _exists(connect, "ad-c")]


@_case("auto-delete: chain through a queue deletion")
def _ad_chain(connect: Callable[[], Raw]) -> list[str]:
    c = connect()
    out = [_ad(c, "ad-e"), _ad(c, "ad-f"), c.rpc(C.Queue.Declare(queue="ad-q"))]
    out.append(c.rpc(C.Exchange.Bind(destination="ad-f", source="ad-e")))
    out.append(c.rpc(C.Queue.Bind(queue="ad-q", exchange="ad-f")))
    out.append(c.rpc(C.Queue.Delete(queue="ad-q")))
    return [*out, _exists(connect, "ad-e"), _exists(connect, "ad-f")]


@_case("auto-delete: never bound, unbound as destination only")
def _ad_never(connect: Callable[[], Raw]) -> list[str]:
    c = connect()
    out = [_ad(c, "ad-g"), _ad(c, "ad-h")]
    out.append(c.rpc(C.Exchange.Bind(destination="ad-h", source="amq.direct", routing_key="x")))
    out.append(c.rpc(C.Exchange.Unbind(destination="ad-h", source="amq.direct", routing_key="x")))
    return [*out, _exists(connect, "ad-g"), _exists(connect, "ad-h")]


for name, method in [
    ("queue.unbind of a missing queue", C.Queue.Unbind(queue="nope", exchange="amq.direct")),
    ("queue.unbind from a missing exchange", C.Queue.Unbind(queue="parity-uq", exchange="nope")),
    (
        "exchange.unbind of a missing source",
        C.Exchange.Unbind(destination="amq.fanout", source="nope"),
    ),
    ("queue.bind of a missing queue", C.Queue.Bind(queue="nope", exchange="amq.direct")),
]:

    def _unbind(connect: Callable[[], Raw], method: Any = method) -> list[str]:
        c = connect()
        c.rpc(C.Queue.Declare(queue="parity-uq"))
        return [c.rpc(method)]

    CASES[name] = _unbind


@_case("update-secret: valid")
def _secret_ok(connect: Callable[[], Raw]) -> list[str]:
    c = connect()
    c.method(0, C.Connection.UpdateSecret(new_secret="guest", reason="r"))
    return [c.reply(), c.rpc(C.Queue.Declare(queue="parity-after"))]


@_case("update-secret: wrong secret")
def _secret_wrong(connect: Callable[[], Raw]) -> list[str]:
    c = connect()
    c.method(0, C.Connection.UpdateSecret(new_secret="wrong", reason="r"))
    return [c.reply()]


for caps in (True, False):

    def _login(connect: Callable[[], Raw], caps: bool = caps) -> list[str]:
        c = connect()
        c.start_ok("wrong", {"authentication_failure_close": True} if caps else {})
        return [c.reply(), c.reply()]

    CASES[f"wrong password, authentication_failure_close={caps}"] = _login


# -- running -----------------------------------------------------------------------------------


def run(port: int) -> dict[str, list[str]]:
    clients: list[Raw] = []

    def connect_open() -> Raw:
        client = Raw(port)
        clients.append(client)
        return client.open()

    def connect_raw() -> Raw:
        client = Raw(port)
        clients.append(client)
        return client

    out: dict[str, list[str]] = {}
    for name, case in CASES.items():
        connect = connect_raw if name.startswith("wrong password") else connect_open
        try:
            out[name] = case(connect)
        except (AssertionError, OSError) as err:
            out[name] = [f"probe failed: {err!r}"]
        finally:
            for client in clients:
                client.close()
            clients.clear()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--all", action="store_true", help="print every case, not only differences")
    parser.add_argument("--rabbitmq-port", type=int, help="a running RabbitMQ (guest/guest)")
    parser.add_argument("--vibemq-port", type=int, help="a running VibeMQ AMQP port")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        rabbit_port = args.rabbitmq_port
        if rabbit_port is None:
            rabbit = stack.enter_context(RabbitMQBroker())
            rabbit_port = rabbit.port
        vibe_port = args.vibemq_port
        if vibe_port is None:
            vibe = VibeMQBroker(
                [sys.executable, "-m", "vibemq_server"],
                amqp=True,
                env={"VIBEMQ_USERS": '{"guest": "guest"}'},
            )
            stack.enter_context(vibe)
            vibe_port = vibe.amqp_port
        theirs = run(rabbit_port)
        ours = run(vibe_port)
    differing = 0
    for name in CASES:
        same = theirs[name] == ours[name]
        differing += not same
        if same and not args.all:
            continue
        print(f"{'same' if same else 'DIFFERS'}: {name}")
        for label, replies in (("  rabbitmq", theirs[name]), ("  vibemq  ", ours[name])):
            print(f"{label}: " + " | ".join(replies))
    print(f"{len(CASES)} cases, {differing} differ")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
