"""Issue 15: every message path side by side in one run, alternating rounds, medians.

Groups (``--groups``, all by default), each case measured once per round, the order of the
cases rotating from round to round so that none always goes first:

* ``paths`` -- 1 publisher -> 1 subscriber with acks, 64-byte JSON, window/prefetch 1,000,
  over ``common.run_throughput`` (raw pre-encoded generators, the same for every case):
  ``native`` (VibeMQ protocol, a queue created with ``durable: false``), ``mqtt`` (our MQTT
  QoS 1, the same broker), ``mosquitto`` (QoS 1); then the round-trip latency of each
  (``common.run_latency``: publish one, wait for its delivery, ack, wait for the publisher ack).
* ``durable`` -- ``native-durable`` (a queue created with ``durable: true`` on the same broker,
  which runs ``--fsync always``), ``mqtt-durable`` (our MQTT QoS 1 with persistent sessions,
  clean session off: a durable queue behind the subscriber) and ``rabbitmq-durable`` (durable
  classic queue, persistent messages, publisher confirms: ``journal_bench.DurableAmqpDriver``),
  with their latency.
* ``fanout`` -- ``native-fanout`` (a ``FanOutWithoutAck`` queue, 10 subscribers in one process
  that never ack; the publisher still counts PublishAcks) against ``mqtt-fanout`` (our MQTT
  QoS 0 1 -> 10, ``mqtt_bench``'s qos0-1to10 generator). deliveries/s = the sum over the
  subscribers / (last delivery - first publish write).
* ``amqp`` -- ``amqp_bench``'s generator against our AMQP listener and RabbitMQ: a consumer
  acking every 1, 10 and 100 deliveries (``multiple``), without publisher confirms
  (``transient``) and with them (``transient-confirm``: transient queue and messages, at most
  ``--window`` unconfirmed), and ``get`` (``basic.get`` polling).

Our broker is one process for all of our cases (MQTT and AMQP listeners on), started with
``--fsync always`` and ``VIBEMQ_QUEUE_DEFAULTS__DURABLE=false`` so that every queue not asked
to be durable is transient; the native cases say ``durable`` explicitly in CreateQueue.
Reported per case: the median deliveries/s over the rounds, the broker's CPU per message
(µs, its process group, over the timed intervals: summed over the rounds / their deliveries,
``common.cpu_us_per_message``, so that a journal segment's rotation counts at its rate),
latency p50/p99, and ratios.

    .venv/bin/python -m bench.paths_bench --rounds 5 --json paths.json
    .venv/bin/python -m bench.paths_bench --groups paths --rounds 1 --messages 20000

Nothing here asserts on timings.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import multiprocessing as mp
import os
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import amqp_bench, mqtt_bench
from bench.brokers import Broker, MosquittoBroker, NotInstalled, RabbitMQBroker, VibeMQBroker
from bench.common import (
    BenchError,
    BlockingConn,
    Driver,
    PubStats,
    _adopt,
    _SubProtocol,
    cpu_seconds,
    cpu_us_per_message,
    encode_batches,
    expect_report,
    install_sigterm_exit,
    median_of,
    publish_pipelined,
    raise_nofile_limit,
    run_latency,
    run_loop,
    run_throughput,
)
from bench.journal_bench import DurableAmqpDriver
from bench.mqtt_driver import MqttDriver
from bench.vibemq_driver import VibeDriver, VibeNoAckScanner, path_queue

GROUPS = ("paths", "durable", "fanout", "amqp")
ACK_EVERY = (1, 10, 100)
FANOUT = 10


@dataclass
class Case:
    """One measured configuration: ``run`` gives a result dict, ``latency`` one too (or None)."""

    name: str
    group: str
    run: Callable[[int], dict[str, Any]]
    latency: Callable[[], dict[str, Any]] | None = None


@dataclass
class Setup:
    args: argparse.Namespace
    vibe: VibeMQBroker
    mosquitto: Broker | None = None
    rabbit: Broker | None = None
    skipped: dict[str, str] = field(default_factory=dict)


def _tag() -> str:
    return uuid.uuid4().hex[:8]


def _per_msg_us(cpu: float | None, count: int) -> float | None:
    return cpu / count * 1e6 if cpu is not None and count else None


# --------------------------------------------------------------------------------------------
# 1 -> 1 with acks (common.run_throughput) and latency (common.run_latency)


def _throughput_case(
    name: str, group: str, make: Callable[[], Driver], broker: Broker, a: argparse.Namespace
) -> Case:
    def run(messages: int) -> dict[str, Any]:
        r = run_throughput(
            make(),
            messages,
            window=a.window,
            batch=a.batch,
            timeout=a.timeout,
            broker_pids=broker.pids,
        )
        return {
            "rate": r.deliver_rate,
            "publish_rate": r.publish_rate,
            "delivered": r.delivered,
            "broker_cpu_s": r.broker_cpu_s,
            "cpu_us_per_msg": _per_msg_us(r.broker_cpu_s, r.delivered),
            "generator_cpu_s": r.publisher_cpu_s + r.subscriber_cpu_s,
            "errors": r.errors,
        }

    def latency() -> dict[str, Any]:
        lat = run_latency(make(), a.samples, timeout=a.timeout)
        return {"p50_us": lat.p50_us, "p99_us": lat.p99_us, "errors": lat.errors}

    return Case(name, group, run, latency if a.samples else None)


# --------------------------------------------------------------------------------------------
# native fan-out without acks: 10 subscriber connections in one process


class _TimedSub(_SubProtocol):
    """``common``'s counting protocol, remembering when the last delivery came."""

    t_last_ns = 0

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self.t_last_ns = time.monotonic_ns()


async def _fanout_consume(
    conns: list[BlockingConn], total: int, drain: float, timeout: float, pipe: Connection
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    protos: list[_TimedSub] = []
    for conn in conns:
        proto = _TimedSub(total, VibeNoAckScanner(), loop.create_future())
        leftover = bytes(conn.buf)
        conn.buf.clear()
        await _adopt(conn, lambda p=proto: p)
        if leftover:
            proto.data_received(leftover)
        protos.append(proto)
    cpu0 = time.process_time()
    deadline = time.monotonic() + timeout
    pub_done: float | None = None
    last_count, last_change = -1, time.monotonic()
    while time.monotonic() < deadline:
        count = sum(p.stats.delivered for p in protos)
        now = time.monotonic()
        if count != last_count:
            last_count, last_change = count, now
        if count >= total * len(protos):
            break
        if pipe.poll():
            pipe.recv()
            pub_done = now
        if pub_done is not None and now - max(pub_done, last_change) > drain:
            break  # without acks the broker may drop: what has not come is lost
        await asyncio.sleep(0.02)
    return {
        "delivered": sum(p.stats.delivered for p in protos),
        "t_last_ns": max(p.t_last_ns for p in protos),
        "cpu_s": time.process_time() - cpu0,
        "errors": [p.stats.error for p in protos if p.stats.error],
    }


def _fanout_sub_main(driver: VibeDriver, n: int, total: int, a: Any, pipe: Connection) -> None:
    try:
        conns = [driver.connect_subscriber() for _ in range(n)]
        pipe.send(("ready", None))
        pipe.send(("done", run_loop(_fanout_consume(conns, total, a[0], a[1], pipe))))
    except Exception as exc:
        pipe.send(("error", f"fan-out subscriber: {exc!r}"))


def _fanout_pub_main(driver: VibeDriver, total: int, a: Any, pipe: Connection) -> None:
    try:
        window, batch, timeout = a
        batches, sizes = encode_batches(driver, total, batch)
        conn = driver.connect_publisher()
        pipe.send(("ready", None))
        counter = driver.ack_counter()
        st = run_loop(publish_pipelined(conn, batches, sizes, window, counter, timeout))
        pipe.send(("done", dataclasses.asdict(st)))
    except Exception as exc:
        pipe.send(("error", f"fan-out publisher: {exc!r}"))


def run_native_fanout(
    driver: VibeDriver, total: int, a: argparse.Namespace, broker: Broker
) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    sub_rx, sub_tx = ctx.Pipe()
    pub_rx, pub_tx = ctx.Pipe()
    sub = ctx.Process(
        target=_fanout_sub_main, args=(driver, FANOUT, total, (a.drain, a.timeout), sub_tx)
    )
    pub = ctx.Process(
        target=_fanout_pub_main, args=(driver, total, (a.window, a.batch, a.timeout), pub_tx)
    )
    out: dict[str, Any] = {"errors": []}
    try:
        sub.start()
        expect_report(sub_rx, "ready", 60)
        cpu0 = cpu_seconds(broker.pids())
        pub.start()
        expect_report(pub_rx, "ready", 60)
        pub_st = PubStats(**expect_report(pub_rx, "done", a.timeout + 30))
        sub_rx.send(("pub_done", None))
        sub_st = expect_report(sub_rx, "done", a.timeout + a.drain + 30)
        broker_cpu = cpu_seconds(broker.pids()) - cpu0
    except BenchError as exc:
        out["errors"].append(str(exc))
        return out
    finally:
        for proc in (sub, pub):
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
    out["errors"] += [e for e in (pub_st.error, *sub_st["errors"]) if e]
    delivered = sub_st["delivered"]
    elapsed = (sub_st["t_last_ns"] - pub_st.t_start_ns) / 1e9
    expected = total * FANOUT
    out.update(
        rate=delivered / elapsed if elapsed > 0 else 0.0,
        delivered=delivered,
        loss_pct=100.0 * (expected - delivered) / expected,
        broker_cpu_s=broker_cpu,
        cpu_us_per_msg=_per_msg_us(broker_cpu, delivered),
        elapsed_s=elapsed,
        publisher_cpu_s=pub_st.cpu_s,
        subscriber_cpu_s=sub_st["cpu_s"],
    )
    return out


def _mqtt_fanout_case(s: Setup) -> Case:
    a = s.args
    scen = next(sc for sc in mqtt_bench.SCENARIOS if sc.name == "qos0-1to10")
    opts = mqtt_bench.Options(
        host=s.vibe.host,
        port=s.vibe.mqtt_port,
        window=a.window,
        batch=a.batch,
        stall_s=a.stall,
        drain_s=a.drain,
        timeout_s=a.timeout,
    )

    def run(messages: int) -> dict[str, Any]:
        r = mqtt_bench.run_scenario(scen, opts, messages, s.vibe.pids())
        return {
            "rate": r.deliveries_per_s,
            "delivered": r.delivered,
            "loss_pct": r.loss_pct,
            "broker_cpu_s": r.broker_cpu_s,
            "cpu_us_per_msg": _per_msg_us(r.broker_cpu_s, r.delivered),
            "elapsed_s": r.elapsed_s,
            "publisher_cpu_s": r.publisher_cpu_s,
            "subscriber_cpu_s": r.subscriber_cpu_s,
            "errors": r.errors,
        }

    return Case("mqtt-fanout", "fanout", run)


# --------------------------------------------------------------------------------------------
# AMQP 0-9-1 against RabbitMQ (amqp_bench's generator)


def _amqp_case(name: str, broker: Broker, port: int, scen_name: str, ack_every: int, s: Setup):
    a = s.args
    scen = next(sc for sc in amqp_bench.SCENARIOS if sc.name == scen_name)
    opts = amqp_bench.Options(
        host=broker.host,
        port=port,
        user="guest",
        password="guest",
        vhost="/",
        prefetch=a.prefetch,
        window=a.window,
        batch=a.batch,
        ack_every=ack_every,
        stall_s=a.stall,
        drain_s=a.drain,
        timeout_s=a.timeout,
        coalesce_s=a.coalesce_us / 1e6,
    )

    def run(messages: int) -> dict[str, Any]:
        r = amqp_bench.run_scenario(scen, opts, messages, broker.pids())
        return {
            "rate": r.deliveries_per_s,
            "publish_rate": r.publish_per_s,
            "delivered": r.delivered,
            "loss_pct": r.loss_pct,
            "broker_cpu_s": r.broker_cpu_s,
            "cpu_us_per_msg": _per_msg_us(r.broker_cpu_s, r.delivered),
            "errors": r.errors,
        }

    return Case(name, "amqp", run)


# --------------------------------------------------------------------------------------------
# setup


def start_brokers(a: argparse.Namespace) -> Setup:
    env = {
        "VIBEMQ_QUEUE_DEFAULTS__DURABLE": "false",
        "VIBEMQ_MQTT__MAX_INFLIGHT": str(a.prefetch),
        "VIBEMQ_MQTT__MAX_QUEUED_MESSAGES": "10000000",
    }
    vibe = VibeMQBroker(
        extra_args=["--fsync", "always", *a.server_arg],
        mqtt=True,
        amqp="amqp" in a.groups,
        env=env,
    )
    vibe.start()
    if a.pin_broker is not None:
        vibe.pin({a.pin_broker})
    s = Setup(a, vibe)
    print(f"[vibemq] native {vibe.port}, MQTT {vibe.mqtt_port}, AMQP {vibe.amqp_port or '-'}")
    wanted: list[tuple[str, Callable[[], Broker]]] = []
    if "paths" in a.groups:
        wanted.append(("mosquitto", lambda: MosquittoBroker(inflight=a.prefetch)))
    if {"durable", "amqp"} & set(a.groups):
        wanted.append(("rabbit", RabbitMQBroker))
    for attr, make in wanted:
        broker = make()
        try:
            broker.start()
            if a.pin_broker is not None and isinstance(broker, MosquittoBroker):
                broker.pin({a.pin_broker})  # single-threaded like ours; RabbitMQ keeps all
            setattr(s, attr, broker)
            print(f"[{broker.name}] on {broker.port}", flush=True)
        except NotInstalled as exc:
            s.skipped[broker.name] = str(exc)
            print(f"[{broker.name}] SKIPPED: {exc}", flush=True)
    return s


def build_cases(s: Setup) -> list[Case]:
    a, vibe = s.args, s.vibe
    h = vibe.host
    cases: list[Case] = []

    def native(durable: bool) -> Callable[[], Driver]:
        return lambda: VibeDriver(
            h, vibe.port, path_queue(durable), prefetch=a.prefetch, durable=durable
        )

    if "paths" in a.groups:
        cases.append(_throughput_case("native", "paths", native(False), vibe, a))
        mqtt = lambda: MqttDriver(h, vibe.mqtt_port, f"b/{_tag()}", name="vibemq-mqtt")  # noqa: E731
        cases.append(_throughput_case("mqtt", "paths", mqtt, vibe, a))
        if s.mosquitto is not None:
            mq = s.mosquitto
            mosq = lambda: MqttDriver(h, mq.port, f"b/{_tag()}")  # noqa: E731
            cases.append(_throughput_case("mosquitto", "paths", mosq, mq, a))
    if "durable" in a.groups:
        durable = native(True)
        cases.append(_throughput_case("native-durable", "durable", durable, vibe, a))
        mqtt_durable = lambda: MqttDriver(  # noqa: E731
            h, vibe.mqtt_port, f"bd/{_tag()}", name="vibemq-mqtt-durable", clean=False
        )
        cases.append(_throughput_case("mqtt-durable", "durable", mqtt_durable, vibe, a))
        if s.rabbit is not None:
            rb = s.rabbit
            rab = lambda: DurableAmqpDriver(h, rb.port, f"rd-{_tag()}", prefetch=a.prefetch)  # noqa: E731
            cases.append(_throughput_case("rabbitmq-durable", "durable", rab, rb, a))
    if "fanout" in a.groups:

        def fan(messages: int) -> dict[str, Any]:
            drv = VibeDriver(h, vibe.port, f"fan-{_tag()}", mode="FanOutWithoutAck", durable=False)
            return run_native_fanout(drv, messages, a, vibe)

        cases += [Case("native-fanout", "fanout", fan), _mqtt_fanout_case(s)]
    if "amqp" in a.groups:
        peers: list[tuple[str, Broker, int]] = [("vibemq", vibe, vibe.amqp_port)]
        if s.rabbit is not None:
            peers.append(("rabbitmq", s.rabbit, s.rabbit.port))
        for scen in ("transient", "transient-confirm"):
            for n in ACK_EVERY:
                for who, broker, port in peers:
                    name = f"amqp-{scen}-ack{n}-{who}"
                    cases.append(_amqp_case(name, broker, port, scen, n, s))
        for who, broker, port in peers:
            cases.append(_amqp_case(f"amqp-get-{who}", broker, port, "get", a.get_ack_every, s))
    return cases


# --------------------------------------------------------------------------------------------
# rounds and the report


def run_rounds(cases: list[Case], a: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {c.name: [] for c in cases}
    if a.warmup:
        for c in cases:
            warm = c.run(a.warmup)
            if warm["errors"]:
                print(f"[{c.name}] warm-up: {warm['errors'][0]}", flush=True)
    for rnd in range(a.rounds):
        shift = rnd % len(cases)
        for c in cases[shift:] + cases[:shift]:
            messages = a.fanout_messages if c.group == "fanout" else a.messages
            r = c.run(messages)
            if c.latency is not None:
                r["latency"] = c.latency()
            runs[c.name].append(r)
            lat = r.get("latency") or {}
            cpu = r.get("cpu_us_per_msg")
            print(
                f"round {rnd + 1} {c.name:<40} {r.get('rate', 0):>10,.0f} msg/s"
                + (f"  broker {cpu:.1f} us/msg" if cpu is not None else "")
                + _busy(r)
                + (f"  p50 {lat['p50_us']:.0f} p99 {lat['p99_us']:.0f} us" if lat else "")
                + (f"  ERRORS: {'; '.join(r['errors'] + lat.get('errors', []))}")
                * bool(r["errors"] or lat.get("errors")),
                flush=True,
            )
    return runs


def _busy(r: dict[str, Any]) -> str:
    """How busy the broker and the generator's two sides were (fan-out: is the generator
    the limit?), as % of a core over the timed interval."""
    elapsed = r.get("elapsed_s")
    if not elapsed or r.get("broker_cpu_s") is None or "subscriber_cpu_s" not in r:
        return ""
    keys = ("broker_cpu_s", "publisher_cpu_s", "subscriber_cpu_s")
    b, p, s = (100 * r[k] / elapsed for k in keys)
    return f"  cpu % broker {b:.0f} pub {p:.0f} sub {s:.0f}"


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, rs in runs.items():
        ok = [r for r in rs if not r["errors"]]
        lats = [r["latency"] for r in rs if r.get("latency") and not r["latency"]["errors"]]
        out[name] = {
            "rate": median_of([r["rate"] for r in ok]),
            "cpu_us_per_msg": cpu_us_per_message(
                (r.get("broker_cpu_s"), r.get("delivered") or 0) for r in ok
            ),
            "loss_pct": median_of([r.get("loss_pct") for r in ok]),
            "p50_us": median_of([x["p50_us"] for x in lats]),
            "p99_us": median_of([x["p99_us"] for x in lats]),
            "ok_runs": len(ok),
            "runs": len(rs),
        }
    return out


RATIOS = (  # label, numerator case, denominator case
    ("native / our MQTT QoS 1", "native", "mqtt"),
    ("native / Mosquitto QoS 1", "native", "mosquitto"),
    ("native durable / native transient", "native-durable", "native"),
    ("native durable / RabbitMQ durable+confirms", "native-durable", "rabbitmq-durable"),
    ("native durable / our MQTT QoS 1 durable", "native-durable", "mqtt-durable"),
    ("native fan-out / our MQTT QoS 0 fan-out", "native-fanout", "mqtt-fanout"),
    *(
        (
            f"AMQP {scen} ack every {n}: ours / RabbitMQ",
            f"{pre}-ack{n}-vibemq",
            f"{pre}-ack{n}-rabbitmq",
        )
        for scen, pre in (("no confirms", "amqp-transient"), ("confirms", "amqp-transient-confirm"))
        for n in ACK_EVERY
    ),
    ("AMQP basic.get: ours / RabbitMQ", "amqp-get-vibemq", "amqp-get-rabbitmq"),
)


def _fmt(v: float | None, spec: str = ",.0f") -> str:
    return "-" if v is None else format(v, spec)


def print_table(summary: dict[str, dict[str, Any]]) -> None:
    head = (
        f"{'case':<40} {'msg/s':>10} {'broker us/msg':>14} {'loss %':>7} {'p50 us':>7} "
        f"{'p99 us':>7} {'ok':>5}"
    )
    print()
    print(head)
    print("-" * len(head))
    for name, m in summary.items():
        print(
            f"{name:<40} {_fmt(m['rate']):>10} {_fmt(m['cpu_us_per_msg'], '.1f'):>14} "
            f"{_fmt(m['loss_pct'], '.2f'):>7} {_fmt(m['p50_us']):>7} {_fmt(m['p99_us']):>7} "
            f"{m['ok_runs']:>2}/{m['runs']:<2}"
        )
    print()
    for label, num, den in RATIOS:
        x, y = summary.get(num, {}).get("rate"), summary.get(den, {}).get("rate")
        if x and y:
            cx, cy = summary[num]["cpu_us_per_msg"], summary[den]["cpu_us_per_msg"]
            cpu = f"  (broker CPU/msg {cx / cy:.2f}x)" if cx and cy else ""
            print(f"{label:<52} {x / y:.2f}x{cpu}")
    print()
    print(
        "medians of the successful rounds; broker us/msg = broker CPU (process group) summed"
        " over those rounds / their deliveries"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add = p.add_argument
    add("--groups", default=",".join(GROUPS), help=f"comma list of {', '.join(GROUPS)}")
    add("--rounds", type=int, default=5, help="alternating rounds (medians over them)")
    add("--messages", type=int, default=200_000, help="per 1 -> 1 / AMQP run")
    add("--fanout-messages", type=int, default=50_000, help="published per fan-out run (x10)")
    add("--warmup", type=int, default=10_000, help="untimed messages per case first (0: none)")
    add("--window", type=int, default=1000, help="unacked publishes")
    add("--batch", type=int, default=100, help="publishes per write")
    add("--prefetch", type=int, default=1000)
    add("--samples", type=int, default=2000, help="latency round trips per case per round")
    add("--get-ack-every", type=int, default=1, help="basic.get: multiple ack every N gets")
    add("--coalesce-us", type=float, default=200.0, help="AMQP consumer (see amqp_bench)")
    add("--stall", type=float, default=20.0)
    add("--drain", type=float, default=2.0, help="fan-out / AMQP: wait after the last, s")
    add("--timeout", type=float, default=120.0, help="per run, s")
    add("--server-arg", action="append", default=[], help="extra vibemq-server argument")
    add(
        "--pin-broker",
        type=int,
        metavar="CPU",
        help="pin our broker and Mosquitto to this CPU (RabbitMQ keeps every core)",
    )
    add("--json", type=Path)
    a = p.parse_args(argv)
    a.groups = [g.strip() for g in a.groups.split(",") if g.strip()]
    if bad := set(a.groups) - set(GROUPS):
        p.error(f"unknown groups {sorted(bad)}")
    if min(a.rounds, a.messages, a.window, a.batch, a.prefetch) < 1:
        p.error("--rounds, --messages, --window, --batch, --prefetch must be positive")
    install_sigterm_exit()
    raise_nofile_limit()
    setup: Setup | None = None
    try:
        setup = start_brokers(a)
        runs = run_rounds(build_cases(setup), a)
    finally:
        if setup is not None:
            for broker in (setup.vibe, setup.mosquitto, setup.rabbit):
                if broker is not None:
                    broker.stop()
    summary = summarize(runs)
    print_table(summary)
    if a.json:
        settings = {k: v for k, v in vars(a).items() if k != "json"}
        doc = {"settings": {**settings, "cpus": os.cpu_count()}, "skipped": setup.skipped}
        doc |= {"median": summary, "runs": runs}
        a.json.write_text(json.dumps(doc, indent=2, default=str) + "\n")
        print(f"wrote {a.json}")
    return 1 if any(m["ok_runs"] < m["runs"] for m in summary.values()) else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
