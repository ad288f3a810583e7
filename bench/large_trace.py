"""MQTT QoS 1 with big payloads, system call by system call: our broker against Mosquitto.

Each broker is launched under ``strace -f -tt -T`` (the socket and event-loop calls only:
read, write, writev, epoll, io_uring_enter, setsockopt) and moves ``--messages`` payloads of
``--size`` bytes from one publisher to one subscriber (``bench.large_bench``'s MQTT case:
the same generators, window and limits). The full trace goes to ``PREFIX-BROKER.txt``; printed
per broker: each call on the publisher's and the subscriber's sockets counted by how it
ended (full: all the bytes asked for; short; EAGAIN), and in which order the delivery and
the PUBACK are written. What a message costs in calls, how large each read is, and where a
delivery waits (a partial write, an EAGAIN, the rest only at the next EPOLLOUT).

    .venv/bin/python -m bench.large_trace --size 1048576 --messages 300 --trace /tmp/t1m
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

from bench.brokers import REPO, Broker, MosquittoBroker, VibeMQBroker
from bench.common import run_throughput
from bench.large_bench import VIBEMQ_LIMITS
from bench.mqtt_driver import MqttDriver

CALLS = (
    "read,write,writev,epoll_wait,epoll_pwait,epoll_ctl,io_uring_enter,setsockopt,accept,accept4"
)
#: pid, time, call(fd, ..., bytes asked) = result  (writev's vector length is not its size)
_CALL = re.compile(r"^\d+\s+\S+\s+(read|write|writev)\((\d+), .*, (\d+)\) = (-?\d+)")
_ACCEPT = re.compile(r"accept4?\(.*\) = (\d+)")


class _TracedMosquitto(MosquittoBroker):
    def __init__(self, strace: list[str]) -> None:
        super().__init__(inflight=1000)
        self.strace = strace

    def _spawn(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        super()._spawn([*self.strace, *argv], env)


def traced(name: str, out: str) -> tuple[Broker, int]:
    """The broker ``name`` started under strace writing to ``out``, and its MQTT port."""
    strace = ["strace", "-f", "-tt", "-T", "-s", "0", "-e", f"trace={CALLS}", "-o", out]
    if name == "mosquitto":
        mosquitto = _TracedMosquitto(strace)
        mosquitto.start()
        return mosquitto, mosquitto.port
    env = dict(VIBEMQ_LIMITS, PYTHONPATH=str(REPO))
    ours = VibeMQBroker([*strace, *VibeMQBroker.default_command()], mqtt=True, env=env)
    ours.start()
    return ours, ours.mqtt_port


def summarize(path: Path) -> str:
    """The calls on the last two accepted sockets (the subscriber's, then the publisher's)."""
    lines = path.read_text().splitlines()
    fds = [m.group(1) for line in lines if (m := _ACCEPT.search(line))]
    sub, pub = fds[-2], fds[-1]
    counts: Counter[tuple[str, str, str]] = Counter()
    # each PUBACK: written before or after the delivery of the PUBLISH just read
    acks: Counter[str] = Counter()
    delivered = False
    for line in lines:
        m = _CALL.match(line)
        if m is None or m.group(2) not in (sub, pub):
            continue
        call, fd, asked, got = m.group(1), m.group(2), int(m.group(3)), int(m.group(4))
        side = "publisher" if fd == pub else "subscriber"
        if got < 0:
            how = "EAGAIN"
        elif call == "writev" or got == asked:
            how = "full" if call != "writev" else "done"
        else:
            how = "short"
        counts[(side, call, how)] += 1
        if side == "publisher" and call == "read":
            delivered = False
        elif side == "subscriber" and call != "read":
            delivered = True
        elif side == "publisher":
            acks["after the delivery" if delivered else "before (or no delivery)"] += 1
    rows = [
        f"  {side:10} {call:6} {how:6} {n:6}" for (side, call, how), n in sorted(counts.items())
    ]
    rows.append("  PUBACKs written " + ", ".join(f"{k}: {v}" for k, v in acks.most_common()))
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024 * 1024)
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--window-bytes", type=int, default=8 * 1024 * 1024)
    parser.add_argument("--brokers", default="vibemq,mosquitto")
    parser.add_argument("--trace", required=True, help="PREFIX: the traces go to PREFIX-BROKER.txt")
    args = parser.parse_args(argv)
    window = max(2, min(1000, args.window_bytes // args.size))
    batch = max(1, min(100, 64 * 1024 // args.size))
    for name in args.brokers.split(","):
        out = Path(f"{args.trace}-{name}.txt")
        broker, port = traced(name, str(out))
        try:
            load = MqttDriver(broker.host, port, "bench/large", args.size, name)
            res = run_throughput(load, args.messages, window=window, batch=batch, timeout=120)
        finally:
            broker.stop()
        print(f"{name}: {res.delivered} of {args.messages} delivered (under strace), {out}")
        print(summarize(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
