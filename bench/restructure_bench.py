"""Before/after a restructuring: two builds of VibeMQ side by side in one run, every protocol.

Issue 12 moved every protocol onto one transport and sans-IO sessions; it must not cost more
than 3 % on any protocol. This runs the same scenario against a *base* build and the *new*
build (this checkout), alternating base/new per round so that both see the same machine:
1 publisher process -> 1 subscriber process, 64-byte payloads, the publisher pipelining up to
``--window`` unacknowledged publishes (VibeMQ PublishAck, MQTT PUBACK, AMQP confirms), the
subscriber acking every delivery with a window of ``--prefetch``; transient queues (the
native queue too, ``VIBEMQ_QUEUE_DEFAULTS__DURABLE=false``) so that the disk is not measured.

Reported per protocol and build: median delivered msg/s and median broker CPU microseconds per
message (steadier than wall-clock rates on a shared machine), and new/base ratios.

    git worktree add --detach ../base <commit> && (cd ../base && python3 -m venv .venv &&
        .venv/bin/pip install -e .)
    .venv/bin/python -m bench.restructure_bench --base ../base/.venv/bin/vibemq-server \\
        --rounds 5 --messages 100000 --json bench/results/restructure.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import uuid
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.amqp_driver import AmqpDriver
from bench.brokers import VibeMQBroker
from bench.common import Driver, install_sigterm_exit, raise_nofile_limit, run_throughput
from bench.mqtt_driver import MqttDriver
from bench.vibemq_driver import VibeDriver

PROTOCOLS = ("native", "mqtt", "amqp")
TRANSIENT = {"VIBEMQ_QUEUE_DEFAULTS__DURABLE": "false"}


def make_driver(protocol: str, broker: VibeMQBroker, prefetch: int) -> Driver:
    tag = uuid.uuid4().hex[:8]
    host = broker.host
    if protocol == "native":
        return VibeDriver(host, broker.port, f"bench-{tag}", prefetch=prefetch)
    if protocol == "mqtt":
        return MqttDriver(host, broker.mqtt_port, f"bench/{tag}", name="vibemq-mqtt")
    return AmqpDriver(host, broker.amqp_port, f"bench-{tag}", prefetch=prefetch, name="vibemq")


def one_run(command: list[str], protocol: str, args: argparse.Namespace) -> dict[str, Any]:
    broker = VibeMQBroker(command, mqtt=protocol == "mqtt", amqp=protocol == "amqp", env=TRANSIENT)
    with broker:
        driver = make_driver(protocol, broker, args.prefetch)
        result = run_throughput(
            driver,
            args.messages,
            window=args.window,
            batch=args.batch,
            timeout=args.timeout,
            broker_pids=broker.pids,
        )
    if result.errors:
        raise SystemExit(f"{protocol} against {command[0]}: {result.errors}")
    cpu = result.broker_cpu_s or 0.0
    return {
        "msg_s": result.deliver_rate,
        "broker_cpu_us_per_msg": cpu * 1e6 / max(1, result.delivered),
        "delivered": result.delivered,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the base build's vibemq-server")
    parser.add_argument("--new", default=None, help="the new build's (default: this checkout)")
    parser.add_argument("--protocols", nargs="+", default=list(PROTOCOLS), choices=PROTOCOLS)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--window", type=int, default=1000)
    parser.add_argument("--prefetch", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    install_sigterm_exit()
    raise_nofile_limit()
    builds = {
        "base": [args.base],
        "new": [args.new] if args.new else VibeMQBroker.default_command(),
    }
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        p: {b: [] for b in builds} for p in args.protocols
    }
    for round_no in range(args.rounds):
        for protocol in args.protocols:
            # Alternate which build goes first, so neither always runs on a warmer machine.
            order = list(builds) if round_no % 2 == 0 else list(reversed(builds))
            for build in order:
                run = one_run(builds[build], protocol, args)
                runs[protocol][build].append(run)
                print(
                    f"round {round_no + 1} {protocol:6} {build:4} {run['msg_s']:>10,.0f} msg/s "
                    f"{run['broker_cpu_us_per_msg']:7.1f} us broker CPU/msg",
                    flush=True,
                )
    summary: dict[str, Any] = {}
    print(
        f"\n{'protocol':8} {'base msg/s':>11} {'new msg/s':>11} {'ratio':>6}   "
        f"{'base us/msg':>11} {'new us/msg':>10} {'ratio':>6}"
    )
    for protocol, by_build in runs.items():
        med = {
            b: {
                "msg_s": statistics.median(r["msg_s"] for r in rs),
                "cpu": statistics.median(r["broker_cpu_us_per_msg"] for r in rs),
            }
            for b, rs in by_build.items()
        }
        rate_ratio = med["new"]["msg_s"] / med["base"]["msg_s"]
        cpu_ratio = med["new"]["cpu"] / med["base"]["cpu"]
        summary[protocol] = {"median": med, "rate_ratio": rate_ratio, "cpu_ratio": cpu_ratio}
        print(
            f"{protocol:8} {med['base']['msg_s']:>11,.0f} {med['new']['msg_s']:>11,.0f} "
            f"{rate_ratio:>6.3f}   {med['base']['cpu']:>11.1f} {med['new']['cpu']:>10.1f} "
            f"{cpu_ratio:>6.3f}"
        )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {"args": vars(args) | {"json": str(args.json)}, "runs": runs, "summary": summary},
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
