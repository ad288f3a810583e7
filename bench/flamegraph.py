"""A flame graph of the broker on the native 1 -> 1 path with acks (issue 15).

Starts ``vibemq-server`` (transient queues: ``VIBEMQ_QUEUE_DEFAULTS__DURABLE=false`` and
``durable: false`` in CreateQueue, or ``--durable`` for the journal path with ``--fsync
always``), attaches ``py-spy record`` to it (``--subprocesses``; as root, or where ptrace is
allowed), drives ``--messages`` through the native path with ``common.run_throughput`` (the
generator of ``vibemq_bench``: window 2,000, prefetch 1,000, an Ack per delivery) and stops
py-spy with SIGINT, which makes it write the profile. Only the broker is sampled, not the
load generator.

    .venv/bin/python -m bench.flamegraph          # writes docs/flamegraph-native-before.svg
    .venv/bin/python -m bench.flamegraph --out docs/flamegraph-native-after.svg
    .venv/bin/python -m bench.flamegraph --format speedscope --out /tmp/native.speedscope.json
    .venv/bin/python -m bench.flamegraph --path mqtt --format raw --out /tmp/mqtt.txt

``--path mqtt`` profiles our MQTT QoS 1 1 -> 1 path instead (the same generator, a clean
session), to compare the two side by side. ``--native`` samples C frames too: with the
compiled build (``scripts/compile.py``) the hot modules' functions are C functions that py-spy
shows only then (``CPyDef_<module>___<Class>___<method>``).

py-spy comes with the dev environment (``.venv/bin/py-spy``) or ``pip install py-spy``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.brokers import REPO, VibeMQBroker
from bench.common import BenchError, Driver, install_sigterm_exit, run_throughput
from bench.mqtt_driver import MqttDriver
from bench.vibemq_driver import VibeDriver


def find_py_spy() -> str:
    for candidate in (Path(sys.prefix) / "bin/py-spy", REPO / ".venv/bin/py-spy"):
        if candidate.exists():
            return str(candidate)
    found = shutil.which("py-spy")
    if found is None:
        raise BenchError("py-spy not found (pip install py-spy)")
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add = p.add_argument
    add("--out", type=Path, default=REPO / "docs/flamegraph-native-before.svg")
    add("--format", default="flamegraph", choices=("flamegraph", "speedscope", "raw"))
    add("--rate", type=int, default=200, help="py-spy samples per second")
    add("--messages", type=int, default=300_000, help="driven through the native path")
    add("--warmup", type=int, default=10_000, help="before py-spy attaches")
    add("--window", type=int, default=2000)
    add("--batch", type=int, default=100)
    add("--prefetch", type=int, default=1000)
    add("--timeout", type=float, default=300.0)
    add("--durable", action="store_true", help="a durable queue, --fsync always")
    add("--path", default="native", choices=("native", "mqtt"), help="native, or MQTT QoS 1")
    add(
        "--native",
        action="store_true",
        help="C frames too (py-spy --native): the compiled build's functions are C functions",
    )
    add("--lines", action="store_true", help="a frame per line (py-spy's default)")
    add("--server-arg", action="append", default=[], help="extra vibemq-server argument")
    a = p.parse_args(argv)
    install_sigterm_exit()
    spy = find_py_spy()
    env = {"VIBEMQ_QUEUE_DEFAULTS__DURABLE": "false"}
    broker = VibeMQBroker(
        extra_args=["--fsync", "always", *a.server_arg], env=env, mqtt=a.path == "mqtt"
    )
    recorder: subprocess.Popen[bytes] | None = None
    try:
        broker.start()

        def driver() -> Driver:
            queue = f"flame-{uuid.uuid4().hex[:8]}"
            if a.path == "mqtt":
                return MqttDriver(broker.host, broker.mqtt_port, f"b/{queue}", name="vibemq-mqtt")
            return VibeDriver(broker.host, broker.port, queue, a.prefetch, durable=a.durable)

        if a.warmup:
            run_throughput(driver(), a.warmup, window=a.window, batch=a.batch, timeout=a.timeout)
        a.out.parent.mkdir(parents=True, exist_ok=True)
        cmd = [spy, "record", "--pid", str(broker.main_pid), "--subprocesses"]
        cmd += ["--rate", str(a.rate), "--format", a.format, "--output", str(a.out)]
        if not a.lines:
            cmd.append("--function")  # one frame per function, not per line: readable
        if a.native:
            cmd.append("--native")
        recorder = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        time.sleep(1.0)  # let py-spy attach before the load starts
        if recorder.poll() is not None:
            out = recorder.stdout.read().decode(errors="replace") if recorder.stdout else ""
            raise BenchError(f"py-spy exited early: {out.strip()}")
        r = run_throughput(
            driver(),
            a.messages,
            window=a.window,
            batch=a.batch,
            timeout=a.timeout,
            broker_pids=broker.pids,
        )
        cpu = r.broker_cpu_s or 0.0
        print(
            f"{a.path} 1 -> 1 under py-spy: {r.delivered:,} delivered"
            f" at {r.deliver_rate:,.0f} msg/s,"
            f" broker {cpu / max(1, r.delivered) * 1e6:.1f} us/msg"
            + (f"  ERRORS: {r.errors}" if r.errors else ""),
            flush=True,
        )
        recorder.send_signal(signal.SIGINT)  # py-spy writes the profile on SIGINT
        out, _ = recorder.communicate(timeout=120)
        print(out.decode(errors="replace").strip()[-500:])
        recorder = None
    finally:
        if recorder is not None and recorder.poll() is None:
            recorder.kill()
            recorder.wait(timeout=10)
        broker.stop()
    if not a.out.exists() or not a.out.stat().st_size:
        print(f"no profile written to {a.out}", file=sys.stderr)
        return 1
    print(f"wrote {a.out} ({os.path.getsize(a.out):,} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
