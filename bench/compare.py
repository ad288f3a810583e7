"""Side-by-side: the same scenario against VibeMQ, Mosquitto and RabbitMQ in one run.

Scenario per broker: 1 publisher process -> 1 subscriber process, 64-byte JSON payloads,
publisher pipelining (at most ``--window`` unacked publishes, broker acks counted: VibeMQ
PublishAck, MQTT PUBACK, AMQP publisher confirms), subscriber acking every delivery (VibeMQ Ack,
MQTT PUBACK, AMQP Basic.Ack) with a prefetch/in-flight window of ``--prefetch``; then a
sequential latency phase (publish -> deliver -> ack, ``--samples`` round trips).

    .venv/bin/python -m bench.compare --messages 200000 --json results.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.amqp_driver import AmqpDriver
from bench.brokers import (
    Broker,
    MosquittoBroker,
    NotInstalled,
    RabbitMQBroker,
    VibeMQBroker,
)
from bench.common import (
    BenchError,
    Driver,
    install_sigterm_exit,
    raise_nofile_limit,
    run_latency,
    run_throughput,
)
from bench.mqtt_driver import MqttDriver
from bench.vibemq_driver import VibeDriver

BROKERS = ("vibemq", "mosquitto", "rabbitmq")


def parse_target(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    return host or "127.0.0.1", int(port)


def make_driver(name: str, host: str, port: int, args: argparse.Namespace) -> Driver:
    tag = uuid.uuid4().hex[:8]
    if name == "vibemq":
        return VibeDriver(host, port, f"bench-{tag}", prefetch=args.prefetch)
    if name == "mosquitto":
        return MqttDriver(host, port, f"bench/{tag}")
    return AmqpDriver(host, port, f"bench-{tag}", prefetch=args.prefetch)


def start_broker(name: str, args: argparse.Namespace) -> Broker:
    if name == "vibemq":
        return VibeMQBroker(extra_args=args.server_arg)
    if name == "mosquitto":
        return MosquittoBroker(inflight=args.prefetch)
    return RabbitMQBroker()


def bench_one(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Throughput then latency against one broker; a dict for the report."""
    out: dict[str, Any] = {"broker": name}
    broker: Broker | None = None
    target = getattr(args, f"{name}_target")
    try:
        if target:
            host, port = parse_target(target)
        else:
            broker = start_broker(name, args)
            t0 = time.monotonic()
            broker.start()
            out["startup_s"] = round(time.monotonic() - t0, 2)
            host, port = broker.host, broker.port
        print(f"[{name}] broker on {host}:{port}", flush=True)
        pids = broker.pids if broker is not None else None
        if args.warmup:
            run_throughput(
                make_driver(name, host, port, args),
                args.warmup,
                window=args.window,
                batch=args.batch,
                timeout=args.timeout,
            )
        thr = run_throughput(
            make_driver(name, host, port, args),
            args.messages,
            window=args.window,
            batch=args.batch,
            timeout=args.timeout,
            broker_pids=pids,
        )
        out["throughput"] = asdict(thr)
        print(
            f"[{name}] delivered {thr.delivered}/{thr.messages} at {thr.deliver_rate:,.0f} msg/s,"
            f" publish {thr.publish_rate:,.0f} msg/s"
            + (f" (broker cpu {thr.broker_cpu_s:.1f}s)" if thr.broker_cpu_s is not None else "")
            + (f" errors: {thr.errors}" if thr.errors else ""),
            flush=True,
        )
        lat = run_latency(make_driver(name, host, port, args), args.samples, timeout=args.timeout)
        out["latency"] = asdict(lat)
        print(
            f"[{name}] latency p50 {lat.p50_us:.0f}us p95 {lat.p95_us:.0f}us "
            f"p99 {lat.p99_us:.0f}us ({lat.samples} samples)"
            + (f" errors: {lat.errors}" if lat.errors else ""),
            flush=True,
        )
        if broker is not None:
            out["broker_rss_kib"] = broker.rss_kib()
    except NotInstalled as exc:
        out["skipped"] = str(exc)
        print(f"[{name}] SKIPPED: {exc}", flush=True)
    except (BenchError, OSError) as exc:
        out["error"] = str(exc)
        print(f"[{name}] FAILED: {exc}", flush=True)
    finally:
        if broker is not None:
            broker.stop()
    return out


def _fmt_rate(v: float | None) -> str:
    return f"{v:,.0f}" if v else "-"


def print_table(results: list[dict[str, Any]]) -> None:
    vibe = next((r for r in results if r["broker"] == "vibemq" and "throughput" in r), None)
    vibe_rate = vibe["throughput"]["deliver_rate"] if vibe else None
    vibe_p50 = vibe["latency"]["p50_us"] if vibe and "latency" in vibe else None
    header = (
        f"{'broker':<10} {'delivered msg/s':>16} {'publish msg/s':>14} {'p50 us':>8} "
        f"{'p99 us':>8} {'VibeMQ/other thr':>17} {'VibeMQ/other p50':>17}"
    )
    print()
    print(header)
    print("-" * len(header))
    for r in results:
        if "throughput" not in r:
            why = r.get("skipped") or r.get("error") or "no result"
            print(f"{r['broker']:<10} {why}")
            continue
        thr, lat = r["throughput"], r.get("latency", {})
        rate = thr["deliver_rate"]
        ratio = f"{vibe_rate / rate:.2f}x" if vibe_rate and rate else "-"
        p50 = lat.get("p50_us") or 0.0
        lat_ratio = f"{vibe_p50 / p50:.2f}x" if vibe_p50 and p50 else "-"
        print(
            f"{r['broker']:<10} {_fmt_rate(rate):>16} {_fmt_rate(thr['publish_rate']):>14} "
            f"{p50:>8.0f} {lat.get('p99_us', 0.0):>8.0f} {ratio:>17} {lat_ratio:>17}"
        )
    print()
    print("VibeMQ/other thr > 1: VibeMQ delivers faster; VibeMQ/other p50 < 1: VibeMQ is faster.")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--brokers", default=",".join(BROKERS), help="comma list (default: all)")
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--warmup", type=int, default=10_000, help="messages before the timed run")
    p.add_argument("--window", type=int, default=2000, help="max unacked publishes")
    p.add_argument("--batch", type=int, default=100, help="publishes per write")
    p.add_argument("--prefetch", type=int, default=1000)
    p.add_argument("--samples", type=int, default=5000, help="latency round trips")
    p.add_argument("--timeout", type=float, default=300.0, help="per phase, seconds")
    p.add_argument("--json", type=Path, help="write results here")
    p.add_argument("--vibemq-target", help="host:port of a running VibeMQ (else started)")
    p.add_argument("--mosquitto-target", help="host:port of a running Mosquitto")
    p.add_argument("--rabbitmq-target", help="host:port of a running RabbitMQ (guest/guest)")
    p.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="extra argument for vibemq-server (repeatable)",
    )
    args = p.parse_args(argv)
    if not 0 < args.window < 65535:
        p.error("--window must be in 1..65534 (MQTT packet ids)")
    install_sigterm_exit()
    raise_nofile_limit()
    names = [n.strip() for n in args.brokers.split(",") if n.strip()]
    for n in names:
        if n not in BROKERS:
            p.error(f"unknown broker {n!r}; choose from {', '.join(BROKERS)}")
    results = [bench_one(n, args) for n in names]
    print_table(results)
    if args.json:
        doc = {
            "scenario": {
                "messages": args.messages,
                "payload_bytes": 64,
                "window": args.window,
                "batch": args.batch,
                "prefetch": args.prefetch,
                "latency_samples": args.samples,
                "cpus": os.cpu_count(),
            },
            "results": results,
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0 if all("throughput" in r or "skipped" in r for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
