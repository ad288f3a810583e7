"""Issue 12 section 1, reproduced as the issue describes it: bounded runs, stalls counted.

Each run starts a fresh ``vibemq-server`` process (port 0, loopback) and drives it with the
raw-frame AMQP generator of ``bench.amqp_driver``:

* a publisher floods ``--messages`` transient 64-byte messages to the default exchange, no
  confirms, in pre-encoded batches;
* one consumer with basic.qos(prefetch_count=1000) reads its socket in large batches
  (SO_RCVLOWAT of 64 KiB, so the broker's writes back up) and sends basic.ack(multiple=True)
  every 100 deliveries, and only then (as the issue's generator does).

A run *stalls* when no delivery arrives for ``--stall`` seconds while the queue still holds
ready messages; the script then reports what the consumer got and left unacked (fewer than
100), the bytes waiting unread in its socket, the queue's ready count (a passive
queue.declare), the broker's own view (``vibemq queue-info``: unacked, delivered, acked), the
broker's CPU use (busy or idle: a livelock or a lost wake-up) and both TCP ends of the
consumer connection (``ss``: bytes queued, drops, retransmits). Every run reports its longest
wait for a delivery. Every run is bounded (``--run-timeout``). ``--hog`` keeps another core
busy (a spinning child process) to shift the timing; ``--memory-high`` sets
VIBEMQ_MEMORY_HIGH_WATERMARK_BYTES; ``--broker rabbitmq`` runs the same against one
RabbitMQ node (bench.brokers).

    PYTHONPATH=$PWD python -m bench.liveness_repro --runs 20
    PYTHONPATH=$PWD python -m bench.liveness_repro --runs 20 --hog --memory-high 1048576
    PYTHONPATH=$PWD python -m bench.liveness_repro --runs 8 --hog --broker rabbitmq

Exits 1 when some run stalled. A bench tool, not a test: it measures under real timing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.amqp_driver import (
    U16,
    AmqpDeliveryScanner,
    AmqpDriver,
    connect,
    encode_ack,
    expect_method,
    method,
    shortstr,
)
from bench.brokers import RabbitMQBroker, VibeMQBroker
from bench.common import BlockingConn

PREFETCH = 1000
ACK_EVERY = 100
RCVLOWAT = 64 * 1024
BATCH = 500  # publishes per write of the publisher


@dataclass
class Outcome:
    got: int
    unacked: int = 0
    unread: int = 0
    ready: int = -1
    stalled: bool = False
    seconds: float = 0.0
    error: str = ""
    #: the broker's own view at a stall (``vibemq queue-info``): unacked, delivered, acked
    broker: str = ""
    #: CPU seconds the broker used in one second at the stall (1.0: busy the whole time)
    cpu: float = -1.0
    #: the longest wait for a delivery, and after how many deliveries it came
    max_gap: float = 0.0
    gap_at: int = 0
    #: the consumer connection's TCP state at a stall (both ends)
    tcp: str = ""


def ready_count(port: int, queue: bytes) -> int:
    """Ready messages of ``queue`` (passive queue.declare's message_count)."""
    conn = connect("127.0.0.1", port, timeout=30)
    try:
        conn.send(method(1, 50, 10, U16.pack(0) + shortstr(queue) + b"\x01" + b"\0\0\0\0"))
        args = expect_method(conn, 50, 11)
        return int(struct.unpack_from(">I", args, 1 + args[0])[0])
    finally:
        conn.close()


def broker_view(native_port: int, queue: str) -> str:
    """What ``vibemq queue-info`` says of the queue: ready, unacked, delivered, acked."""
    cmd = [sys.executable, "-m", "vibemq_server.client.cli", "--host", "127.0.0.1"]
    cmd += ["--port", str(native_port), "queue-info", queue]
    try:
        info = json.loads(subprocess.run(cmd, capture_output=True, timeout=30).stdout)
    except (subprocess.TimeoutExpired, ValueError) as exc:
        return f"queue-info failed: {exc}"
    stats = info["stats"]
    return (
        f"broker: ready={info['messageCount']} unacked={info['unackedCount']}"
        f" delivered={stats['delivered']} acked={stats['acked']}"
    )


def unread_bytes(sock: socket.socket) -> int:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
    try:
        return len(sock.recv(1 << 22, socket.MSG_PEEK))
    except (BlockingIOError, TimeoutError):
        return 0
    finally:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, RCVLOWAT)


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tcp_state(port: int, consumer_port: int) -> str:
    """The consumer connection's two TCP ends (``ss``): queued bytes, drops, retransmits."""
    text = subprocess.run(
        ["ss", "-tnmiH", f"( sport = :{consumer_port} or dport = :{consumer_port} )"],
        capture_output=True,
        text=True,
    ).stdout
    out = []
    for block in re.split(r"\n(?=\S)", text.strip()):
        head = block.split()
        if len(head) < 5:
            continue
        side = "consumer" if head[3].endswith(f":{consumer_port}") else "broker"
        drops = re.search(r",d(\d+)\)", block)
        retrans = re.search(r"bytes_retrans:(\d+)", block)
        backoff = re.search(r"backoff:(\d+)", block)
        out.append(
            f"{side}[recvq={head[1]} sendq={head[2]} drops={drops.group(1) if drops else 0}"
            f" retrans={retrans.group(1) if retrans else 0}"
            f" backoff={backoff.group(1) if backoff else 0}]"
        )
    return " ".join(out)


def one_run(target: Target, queue: str, ns: argparse.Namespace) -> Outcome:
    total = ns.messages
    driver = AmqpDriver("127.0.0.1", target.port, queue, prefetch=PREFETCH, name="vibemq")
    sub = driver.connect_subscriber()  # declares the queue, qos 1000, consume, manual acks
    pub: BlockingConn = driver._open()  # no confirm.select
    stop = threading.Event()

    def publish() -> None:
        with contextlib.suppress(OSError):
            for start in range(0, total, BATCH):
                if stop.is_set():
                    return
                pub.send(driver.publish_batch(start, min(BATCH, total - start)))

    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    sock = sub.sock
    if ns.rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, ns.rcvbuf)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, RCVLOWAT)
    sock.settimeout(0.25)
    scanner = AmqpDeliveryScanner()
    got = acked = 0
    began = last = time.monotonic()
    out = Outcome(0)
    try:
        while got < total:
            now = time.monotonic()
            if now - began > ns.run_timeout:
                out.error = "run timeout"
                break
            if now - last > ns.stall:
                waited = now - last
                # Busy or idle while nothing arrives, and where the bytes are.
                if target.pid:
                    cpu = cpu_seconds(target.pid)
                    time.sleep(0.5)
                    out.cpu = (cpu_seconds(target.pid) - cpu) / 0.5
                out.tcp = tcp_state(target.port, sock.getsockname()[1])
                out.unread = unread_bytes(sock)
                out.ready = ready_count(target.port, queue.encode())
                # Nothing ready: the tail of the run waits below the low-water mark, which
                # is the consumer's doing; ready messages with room at the consumer are not.
                out.stalled = out.ready > 0
                if out.stalled:
                    out.max_gap, out.gap_at = waited, got
                if out.stalled and target.native_port:
                    out.broker = broker_view(target.native_port, queue)
                break
            try:
                chunk = sock.recv(1 << 20)
            except TimeoutError:
                continue
            if not chunk:
                out.error = "closed by the broker"
                break
            sub.buf += chunk
            used, delivered, _acks = scanner.feed(sub.buf)
            del sub.buf[:used]
            if not delivered:
                continue
            gap = time.monotonic() - last
            if gap > out.max_gap:
                out.max_gap, out.gap_at = gap, got
            last += gap
            got += delivered
            # basic.ack(multiple) every 100 deliveries (delivery tags count from 1)
            while got - acked >= ACK_EVERY:
                acked += ACK_EVERY
                sock.sendall(encode_ack(acked, multiple=True))
    finally:
        stop.set()
        out.got = got
        out.unacked = got - acked
        out.seconds = time.monotonic() - began
        driver.goodbye(sub)
        driver.goodbye(pub)
        publisher.join(5)
    return out


@dataclass
class Target:
    port: int
    native_port: int = 0  # VibeMQ's (for ``vibemq queue-info``)
    pid: int = 0  # the broker process (CPU time at a stall)


@contextlib.contextmanager
def vibemq(env: dict[str, str]) -> Iterator[Target]:
    """A fresh ``python -m vibemq_server`` with AMQP (bench.brokers: any free port, a temporary
    directory, stopped whatever happens)."""
    broker = VibeMQBroker([sys.executable, "-m", "vibemq_server"], amqp=True, env=env)
    broker.start()
    try:
        yield Target(broker.amqp_port, broker.port, broker.main_pid or 0)
    finally:
        broker.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--stall", type=float, default=3.0, help="seconds without a delivery")
    ap.add_argument("--run-timeout", type=float, default=120.0)
    ap.add_argument("--memory-high", type=int, default=0, help="memory high watermark (bytes)")
    ap.add_argument("--write-high", type=int, default=0, help="write buffer high (bytes)")
    ap.add_argument("--hog", action="store_true", help="keep another core busy")
    ap.add_argument("--rcvbuf", type=int, default=0, help="the consumer's SO_RCVBUF")
    ap.add_argument(
        "--broker", choices=("vibemq", "rabbitmq"), default="vibemq", help="rabbitmq: one node"
    )
    ns = ap.parse_args()
    env: dict[str, str] = {}
    if ns.memory_high:
        env["VIBEMQ_MEMORY_HIGH_WATERMARK_BYTES"] = str(ns.memory_high)
    if ns.write_high:
        env["VIBEMQ_WRITE_BUFFER_HIGH_BYTES"] = str(ns.write_high)
    hog = None
    if ns.hog:
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    stalls = 0
    worst = 0.0
    rabbit: RabbitMQBroker | None = None
    try:
        if ns.broker == "rabbitmq":
            rabbit = RabbitMQBroker()
            rabbit.start()
        for i in range(ns.runs):
            if rabbit is not None:
                out = one_run(Target(rabbit.port), f"repro-{i}", ns)
            else:
                with vibemq(env) as target:
                    out = one_run(target, "repro", ns)
            stalls += out.stalled
            worst = max(worst, out.max_gap)
            verdict = "STALL" if out.stalled else ("ERROR" if out.error else "ok")
            print(
                f"run {i + 1}: {verdict} got={out.got} unacked={out.unacked} unread={out.unread}"
                f" ready={out.ready} {out.seconds:.1f}s max-gap={out.max_gap:.2f}s@{out.gap_at}"
                f" {out.error}{out.broker}"
                + (f" broker-cpu={out.cpu:.2f} {out.tcp}" if out.stalled else ""),
                flush=True,
            )
    finally:
        if rabbit is not None:
            rabbit.stop()
        if hog is not None:
            hog.kill()
            hog.wait()
    print(f"stalls: {stalls}/{ns.runs}, longest wait for a delivery: {worst:.2f}s", flush=True)
    return 1 if stalls else 0


if __name__ == "__main__":
    sys.exit(main())
