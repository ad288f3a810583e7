"""Native against our MQTT with big payloads, per message (issue 16): one VibeMQ, no peers.

The cases of ``bench.large_bench`` (the same load generator, payloads, window and native
prefetch) alternating on one broker, and per message delivered: the broker's read and write
system calls and bytes beyond the payload (``/proc/PID/io``: syscr, syscw, rchar, wchar)
besides its CPU per MB. ``--perf PREFIX`` records the broker (``perf record -g``) during
each protocol's last round into ``PREFIX-native.data`` / ``PREFIX-mqtt.data``, to compare
where each spends (``perf report -i ... --no-children --sort dso,sym -g none``).

    .venv/bin/python -m bench.large_profile --size 1048576 --messages 2000 --rounds 3
    .venv/bin/python -m bench.large_profile --size 65536 --messages 20000 --perf /tmp/p64
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import time
from pathlib import Path

from bench.brokers import VibeMQBroker
from bench.common import Driver, run_throughput
from bench.large_bench import VIBEMQ_LIMITS
from bench.mqtt_driver import MqttDriver
from bench.vibemq_driver import VibeDriver

_IO_KEYS = ("rchar", "wchar", "syscr", "syscw")


def io_counts(pids: list[int]) -> dict[str, int]:
    """The processes' read/write calls and bytes so far (``/proc/PID/io``)."""
    out = dict.fromkeys(_IO_KEYS, 0)
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/io").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key in out:
                out[key] += int(value)
    return out


def driver(proto: str, broker: VibeMQBroker, size: int, prefetch: int) -> Driver:
    if proto == "native":
        return VibeDriver(
            broker.host, broker.port, "bench-large", prefetch, size, durable=False, name="vibemq"
        )
    return MqttDriver(broker.host, broker.mqtt_port, "bench/large", size, "vibemq")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024 * 1024)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window-bytes", type=int, default=8 * 1024 * 1024)
    parser.add_argument("--native-prefetch", type=int, default=1000, help="as large_bench's")
    parser.add_argument("--perf", help="perf record the last round into PREFIX-PROTO.data")
    args = parser.parse_args(argv)
    size = args.size
    window = max(2, min(1000, args.window_bytes // size))
    batch = max(1, min(100, 64 * 1024 // size))
    prefetch = args.native_prefetch or window
    broker = VibeMQBroker(mqtt=True, env=dict(VIBEMQ_LIMITS))
    broker.start()
    try:
        for r in range(args.rounds):
            order = ("native", "mqtt") if r % 2 == 0 else ("mqtt", "native")
            for proto in order:
                pids = broker.pids()
                perf = None
                if args.perf and r == args.rounds - 1:
                    out = f"{args.perf}-{proto}.data"
                    target = ",".join(map(str, pids))
                    perf = subprocess.Popen(
                        ["perf", "record", "-F", "1999", "-g", "-o", out, "-p", target],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                    time.sleep(0.5)  # (attached before the run starts)
                before = io_counts(pids)
                res = run_throughput(
                    driver(proto, broker, size, prefetch),
                    args.messages,
                    window=window,
                    batch=batch,
                    timeout=120,
                    broker_pids=broker.pids,
                )
                after = io_counts(pids)
                if perf is not None:
                    perf.send_signal(signal.SIGINT)
                    perf.wait()
                n = res.delivered or 1
                per = {k: (after[k] - before[k]) / n for k in _IO_KEYS}
                cpu = res.broker_cpu_s or 0.0
                print(
                    f"{proto:6} {size:>8} B: {res.deliver_rate:9,.0f} msg/s, broker "
                    f"{cpu * 1000 / (n * size / 1e6):.3f} ms CPU/MB; per message: reads "
                    f"{per['syscr']:.2f}, writes {per['syscw']:.2f}, bytes read beyond the "
                    f"payload {per['rchar'] - size:+.0f}, written {per['wchar'] - size:+.0f}",
                    flush=True,
                )
    finally:
        broker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
