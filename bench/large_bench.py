"""Large messages side by side (issue 16, goal 1): VibeMQ against Mosquitto and RabbitMQ.

Every broker runs at once on free loopback ports; each payload size is measured in rounds,
the cases of a round in alternating order (reversed every other round), so a busy machine
hurts all of them alike. The cases, 1 publisher -> 1 subscriber with a raw load generator
(bench.common.run_throughput: pre-encoded frames, a pipelined publisher, acks from the
subscriber):

* ``mosquitto`` / ``vibemq-mqtt``: MQTT 3.1.1 QoS 1, clean sessions;
* ``rabbitmq`` / ``vibemq-amqp``: AMQP 0-9-1, publisher confirms, manual acks with a
  prefetch, a transient queue; a body over 128 KiB is split into body frames (frame_max
  131,072, RabbitMQ's and our default);
* ``vibemq-native``: the native protocol, a transient RoundRobin queue, the same bytes; the
  subscriber's prefetch is 1,000 (``--native-prefetch``), the deliveries in flight both MQTT
  brokers grant theirs, so that native and MQTT are compared under the same flow control.

Payloads are JSON texts (bench.common.make_payload) of exactly the size asked for. Reported
per case: messages/s and MB/s delivered, the broker's CPU per MB delivered (user + system
time of its process group from /proc/PID/stat), and the ratios ours/theirs (MQTT against
Mosquitto, AMQP against RabbitMQ, native against our MQTT). ``--baseline DIR`` adds a second
VibeMQ run from another checkout (``PYTHONPATH=DIR``: before/after in the same run).

    .venv/bin/python -m bench.large_bench
    .venv/bin/python -m bench.large_bench --sizes 65536,1048576 --rounds 3 --json large.json
    .venv/bin/python -m bench.large_bench --protocols mqtt --baseline /work/main
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.amqp_driver import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_METHOD,
    HDR,
    MID,
    AmqpDriver,
    frame,
    method,
    shortstr,
)
from bench.brokers import Broker, MosquittoBroker, NotInstalled, RabbitMQBroker, VibeMQBroker
from bench.common import (
    BenchError,
    Buffer,
    Driver,
    install_sigterm_exit,
    make_payload,
    median_of,
    raise_nofile_limit,
    run_throughput,
)
from bench.mqtt_driver import MqttDriver
from bench.vibemq_driver import VibeDriver

KIB = 1024
MIB = 1024 * 1024
DEFAULT_SIZES = (64, 4 * KIB, 64 * KIB, MIB, 16 * MIB)
#: A body frame's payload: frame_max 131,072 less the 8 framing bytes.
BODY_CHUNK = 131_072 - 8
#: Limits that let 16 MiB (and up to 64 MiB) messages through every protocol of ours.
VIBEMQ_LIMITS = {
    "VIBEMQ_MAX_MESSAGE_SIZE": str(64 * MIB + 64 * KIB),
    "VIBEMQ_MQTT__MAX_PACKET_SIZE": str(64 * MIB + 64 * KIB),
    "VIBEMQ_AMQP__MAX_MESSAGE_SIZE": str(64 * MIB + 64 * KIB),
    "VIBEMQ_MQTT__MAX_INFLIGHT": "1000",
    "VIBEMQ_MQTT__MAX_QUEUED_MESSAGES": "10000000",
}

_BASIC_DELIVER = (60, 60)
_ACK_PREFIX = HDR.pack(FRAME_METHOD, 1, 13) + MID.pack(60, 80)
_ACK_SUFFIX = b"\x00\xce"


class LargeAmqpScanner:
    """Counts deliveries whose bodies span any number of body frames: a delivery is counted,
    and acked, when its content header's body size has arrived in body frames."""

    def __init__(self) -> None:
        self.tag = b""
        self.left = 0  # body bytes still to come for the current delivery

    def feed(self, buf: Buffer, end: int = -1) -> tuple[int, int, bytes]:
        pos = 0
        end = len(buf) if end < 0 else end
        delivered = 0
        acks: list[bytes] = []
        while end - pos >= 7:
            kind, _ch, size = HDR.unpack_from(buf, pos)
            if end - pos < size + 8:
                break
            if kind == FRAME_METHOD:
                got = MID.unpack_from(buf, pos + 7)
                if got == _BASIC_DELIVER:
                    tag_at = pos + 12 + buf[pos + 11]  # after the consumer-tag shortstr
                    self.tag = bytes(buf[tag_at : tag_at + 8])
                elif got in ((10, 50), (20, 40)):
                    raise BenchError(f"AMQP close from the broker: {bytes(buf[pos : pos + 64])!r}")
            elif kind == FRAME_HEADER:
                (self.left,) = struct.unpack_from(">Q", buf, pos + 11)
                if not self.left:
                    delivered += 1
                    acks.append(_ACK_PREFIX + self.tag + _ACK_SUFFIX)
            elif kind == FRAME_BODY:
                self.left -= size
                if self.left <= 0:
                    delivered += 1
                    acks.append(_ACK_PREFIX + self.tag + _ACK_SUFFIX)
            pos += size + 8
        return pos, delivered, b"".join(acks)


@dataclass
class LargeAmqpDriver(AmqpDriver):
    """AmqpDriver whose publishes split a large body over frame_max-sized body frames."""

    def publish_batch(self, start: int, count: int) -> bytes:
        pub = method(1, 60, 40, b"\x00\x00" + shortstr(b"") + shortstr(self.queue.encode()) + b"\0")
        out: list[bytes] = []
        for i in range(start, start + count):
            body = make_payload(i, self.payload_size)
            out.append(pub)
            out.append(frame(FRAME_HEADER, 1, struct.pack(">HHQH", 60, 0, len(body), 0)))
            view = memoryview(body)
            for at in range(0, len(body), BODY_CHUNK):
                out.append(frame(FRAME_BODY, 1, bytes(view[at : at + BODY_CHUNK])))
        return b"".join(out)

    def delivery_scanner(self) -> LargeAmqpScanner:  # type: ignore[override]
        return LargeAmqpScanner()


@dataclass
class Case:
    name: str
    protocol: str
    broker: Broker
    make: Callable[[int, int], Driver]  # (payload size, window) -> driver


@dataclass
class Sample:
    case: str
    size: int
    messages: int
    msg_s: float
    mb_s: float
    cpu_ms_per_mb: float | None
    errors: list[str] = field(default_factory=list)
    #: the publisher's and the subscriber's CPU over the run's time (1.0: a core all along;
    #: near it, the client sets the rate, not the broker)
    pub_load: float = 0.0
    sub_load: float = 0.0


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


def plan(size: int, args: argparse.Namespace) -> tuple[int, int, int]:
    """(messages, window, batch) for one payload size: about ``--run-bytes`` per run, about
    ``--window-bytes`` in flight, publishes written about 64 KiB at a time."""
    messages = _clamp(args.run_bytes // size, args.min_messages, args.max_messages)
    window = _clamp(args.window_bytes // size, 2, 1000)
    batch = _clamp(64 * KIB // size, 1, 100)
    return messages, window, batch


def make_cases(args: argparse.Namespace, started: list[Broker]) -> list[Case]:
    protocols = set(args.protocols.split(","))
    cases: list[Case] = []

    def start(broker: Broker) -> Broker | None:
        try:
            broker.start()
        except NotInstalled as exc:
            print(f"skipped: {exc}", file=sys.stderr)
            return None
        started.append(broker)
        return broker

    def ours(label: str, pythonpath: str | None) -> None:
        env = dict(VIBEMQ_LIMITS)
        if pythonpath is not None:
            env["PYTHONPATH"] = pythonpath
        broker = start(VibeMQBroker(mqtt="mqtt" in protocols, amqp="amqp" in protocols, env=env))
        if broker is None:
            return
        vb = broker
        assert isinstance(vb, VibeMQBroker)
        if "mqtt" in protocols:
            cases.append(
                Case(
                    f"{label}-mqtt",
                    "mqtt",
                    vb,
                    lambda s, w: MqttDriver(vb.host, vb.mqtt_port, "bench/large", s, "vibemq"),
                )
            )
        if "amqp" in protocols:
            cases.append(
                Case(
                    f"{label}-amqp",
                    "amqp",
                    vb,
                    lambda s, w: LargeAmqpDriver(
                        vb.host, vb.amqp_port, "bench-large", w, s, name="vibemq"
                    ),
                )
            )
        if "native" in protocols:
            cases.append(
                Case(
                    f"{label}-native",
                    "native",
                    vb,
                    lambda s, w: VibeDriver(
                        vb.host,
                        vb.port,
                        "bench-large",
                        args.native_prefetch or w,
                        s,
                        durable=False,
                        name="vibemq",
                    ),
                )
            )

    if "mqtt" in protocols:
        mosq = start(MosquittoBroker(inflight=1000))
        if mosq is not None:
            mb = mosq
            cases.append(
                Case(
                    "mosquitto",
                    "mqtt",
                    mb,
                    lambda s, w: MqttDriver(mb.host, mb.port, "bench/large", s, "mosquitto"),
                )
            )
    if "amqp" in protocols:
        rabbit = start(RabbitMQBroker())
        if rabbit is not None:
            rb = rabbit
            cases.append(
                Case(
                    "rabbitmq",
                    "amqp",
                    rb,
                    lambda s, w: LargeAmqpDriver(rb.host, rb.port, "bench-large", w, s),
                )
            )
    ours("vibemq", None)
    if args.baseline:
        ours(args.baseline_label, args.baseline)
    return cases


def measure(case: Case, size: int, args: argparse.Namespace) -> Sample:
    messages, window, batch = plan(size, args)
    driver = case.make(size, window)
    result = run_throughput(
        driver,
        messages,
        window=window,
        batch=batch,
        timeout=args.timeout,
        broker_pids=case.broker.pids,
    )
    mb = result.delivered * size / 1e6
    cpu = result.broker_cpu_s
    return Sample(
        case.name,
        size,
        result.delivered,
        result.deliver_rate,
        result.deliver_rate * size / 1e6,
        cpu * 1000 / mb if cpu is not None and mb else None,
        result.errors,
        result.publisher_cpu_s / result.elapsed_s if result.elapsed_s else 0.0,
        result.subscriber_cpu_s / result.elapsed_s if result.elapsed_s else 0.0,
    )


def summarize(samples: list[Sample]) -> dict[tuple[str, int], dict[str, float | None]]:
    groups: dict[tuple[str, int], list[Sample]] = {}
    for s in samples:
        if not s.errors:
            groups.setdefault((s.case, s.size), []).append(s)
    return {
        key: {
            "msg_s": median_of([s.msg_s for s in group]),
            "mb_s": median_of([s.mb_s for s in group]),
            "cpu_ms_per_mb": median_of([s.cpu_ms_per_mb for s in group if s.cpu_ms_per_mb]),
        }
        for key, group in groups.items()
    }


def ratios(baseline: str) -> list[tuple[str, str]]:
    """The (ours, theirs) pairs whose ratio of deliveries/s is reported."""
    return [
        ("vibemq-mqtt", "mosquitto"),
        ("vibemq-amqp", "rabbitmq"),
        ("vibemq-native", "vibemq-mqtt"),
        *((f"vibemq-{p}", f"{baseline}-{p}") for p in ("mqtt", "amqp", "native")),
    ]


def _size_name(size: int) -> str:
    if size >= MIB and size % MIB == 0:
        return f"{size // MIB} MiB"
    if size >= KIB and size % KIB == 0:
        return f"{size // KIB} KiB"
    return f"{size} B"


def print_table(
    summary: dict[tuple[str, int], dict[str, float | None]], sizes: list[int], baseline: str
) -> None:
    names = sorted({k[0] for k in summary})
    print("\n| size | case | msg/s | MB/s | broker CPU ms/MB |")
    print("|---|---|---:|---:|---:|")
    for size in sizes:
        for name in names:
            row = summary.get((name, size))
            if row is None:
                continue
            cpu = row["cpu_ms_per_mb"]
            print(
                f"| {_size_name(size)} | {name} | {row['msg_s'] or 0:,.0f} | "
                f"{row['mb_s'] or 0:,.1f} | {'-' if cpu is None else f'{cpu:.2f}'} |"
            )
    print("\n| size | ours / theirs | msg/s ratio | CPU/MB ratio (theirs / ours) |")
    print("|---|---|---:|---:|")
    for size in sizes:
        for mine, theirs in ratios(baseline):
            a, b = summary.get((mine, size)), summary.get((theirs, size))
            if not a or not b or not a["msg_s"] or not b["msg_s"]:
                continue
            cpu_ratio = (
                f"{b['cpu_ms_per_mb'] / a['cpu_ms_per_mb']:.2f}x"
                if a["cpu_ms_per_mb"] and b["cpu_ms_per_mb"]
                else "-"
            )
            print(
                f"| {_size_name(size)} | {mine} / {theirs} | "
                f"**{a['msg_s'] / b['msg_s']:.2f}x** | {cpu_ratio} |"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(str(s) for s in DEFAULT_SIZES))
    parser.add_argument("--protocols", default="mqtt,amqp,native")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--run-bytes", type=int, default=64 * MIB, help="payload bytes per run")
    parser.add_argument("--min-messages", type=int, default=8)
    parser.add_argument("--max-messages", type=int, default=20_000)
    parser.add_argument("--window-bytes", type=int, default=8 * MIB, help="bytes in flight")
    parser.add_argument(
        "--native-prefetch",
        type=int,
        default=1000,
        help="the native subscriber's prefetch: 1,000 by default, the deliveries in flight both"
        " MQTT brokers grant their subscriber (like with like); 0 = the publisher's window, as"
        " the AMQP consumers' prefetch",
    )
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--baseline", help="also run VibeMQ with PYTHONPATH=BASELINE")
    parser.add_argument(
        "--baseline-label", default="baseline", help="its name in the tables (e.g. compiled)"
    )
    parser.add_argument("--json", type=Path, help="write every sample here")
    args = parser.parse_args(argv)
    install_sigterm_exit()
    raise_nofile_limit()
    sizes = [int(s) for s in args.sizes.split(",")]
    started: list[Broker] = []
    samples: list[Sample] = []
    try:
        cases = make_cases(args, started)
        for size in sizes:
            messages, window, batch = plan(size, args)
            print(f"# {_size_name(size)}: {messages} messages, window {window}, batch {batch}")
            for round_no in range(args.rounds):
                order = cases if round_no % 2 == 0 else cases[::-1]
                for case in order:
                    sample = measure(case, size, args)
                    samples.append(sample)
                    cpu = sample.cpu_ms_per_mb
                    print(
                        f"  round {round_no + 1} {case.name:16} {sample.msg_s:10,.0f} msg/s "
                        f"{sample.mb_s:8,.1f} MB/s  cpu "
                        f"{'-' if cpu is None else f'{cpu:.2f}'} ms/MB  clients' CPU pub "
                        f"{sample.pub_load:.2f} sub {sample.sub_load:.2f}"
                        + (f"  ERRORS {sample.errors}" if sample.errors else ""),
                        flush=True,
                    )
    finally:
        for broker in started:
            broker.stop()
    summary = summarize(samples)
    print_table(summary, sizes, args.baseline_label)
    if args.json:
        data: dict[str, Any] = {
            "samples": [s.__dict__ for s in samples],
            "summary": [{"case": k[0], "size": k[1], **v} for k, v in summary.items()],
        }
        args.json.write_text(json.dumps(data, indent=1))
    return 1 if any(s.errors for s in samples) else 0


if __name__ == "__main__":
    sys.exit(main())
