"""Issue 15 over sockets: what the broker's kernel side costs a message, native against MQTT.

One broker (transient queues, MQTT listener on), then ``--rounds`` rounds of ``build_ab``'s
paths (``common.run_throughput``: window 1,000, batch 100, prefetch 1,000), and around each
run the broker's ``/proc/PID/io`` (syscr, syscw, rchar, wchar), ``/proc/PID/status``
(voluntary and involuntary context switches), ``/proc/PID/stat`` (user and system CPU in
clock ticks, minor faults) and its threads' ``schedstat`` (``run_us``: time on a CPU, to the
nanosecond), summed over its process group. Printed per message, the medians of the rounds:
read and write syscalls, bytes read and written, switches, faults, CPU; the publisher's and
subscriber's CPU; messages per read and per write syscall. The counters include the run's
setup (connect, subscribe) and teardown: a few dozen syscalls against 100,000 messages.
``--callgrind DIR`` runs the broker under callgrind, its instrumentation on for each run
only, and dumps one profile a run (the whole broker: transport, sessions, core).

    .venv/bin/python -m bench.sock_counts --rounds 3 --messages 100000
    .venv/bin/python -m bench.sock_counts --rounds 1 --messages 20000 --callgrind /tmp/cg

Nothing here asserts on anything.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.brokers import VibeMQBroker
from bench.build_ab import run_path
from bench.common import install_sigterm_exit

#: /proc/PID/stat fields (1-based, after the command's parentheses split off): minflt 10,
#: utime 14, stime 15
_MINFLT, _UTIME, _STIME = 10, 14, 15
_TICK = os.sysconf("SC_CLK_TCK")


def _counters(pid: int) -> dict[str, float]:
    """One process's counters (zeros if it is gone)."""
    out: dict[str, float] = {}
    try:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            key, value = line.split(":")
            if key in ("syscr", "syscw", "rchar", "wchar"):
                out[key] = float(value)
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
                out[key.split("_")[0]] = float(value)
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        # (fields[0] is field 3, the state)
        out["minflt"] = float(fields[_MINFLT - 3])
        out["user_us"] = int(fields[_UTIME - 3]) / _TICK * 1e6
        out["sys_us"] = int(fields[_STIME - 3]) / _TICK * 1e6
        out["cpu_us"] = out["user_us"] + out["sys_us"]
        # (the same to the nanosecond: the time on a CPU of each of its threads)
        out["run_us"] = sum(
            int(path.read_text().split()[0]) / 1e3
            for path in Path(f"/proc/{pid}/task").glob("*/schedstat")
        )
    except (OSError, ValueError, IndexError):
        return {}
    return out


def snapshot(pids: list[int]) -> dict[str, float]:
    total: dict[str, float] = {}
    for pid in pids:
        for key, value in _counters(pid).items():
            total[key] = total.get(key, 0.0) + value
    return total


def _callgrind(broker: VibeMQBroker, *args: str) -> None:
    for pid in broker.pids():
        subprocess.run(["callgrind_control", *args, str(pid)], check=False, capture_output=True)


def run_args(doc: str | None, rounds: int, messages: int) -> argparse.ArgumentParser:
    """The options of a bench running ``build_ab``'s paths on one broker (this one's and
    ``stall_probe``'s)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=rounds)
    p.add_argument("--messages", type=int, default=messages)
    p.add_argument("--paths", default="native,mqtt")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--checkout", type=Path, default=Path.cwd(), help="the broker's modules")
    return p


def main(argv: list[str] | None = None) -> int:
    p = run_args(__doc__, 3, 100_000)
    p.add_argument(
        "--broker-command", default="", help="the broker's command (default: vibemq-server)"
    )
    p.add_argument(
        "--callgrind",
        type=Path,
        help="run the broker under callgrind, instrumentation on for each run only, one dump "
        "a run in this directory",
    )
    a = p.parse_args(argv)
    paths = [x.strip() for x in a.paths.split(",") if x.strip()]
    install_sigterm_exit()
    command = shlex.split(a.broker_command) or None
    if a.callgrind is not None:
        a.callgrind.mkdir(parents=True, exist_ok=True)
        out = a.callgrind.resolve() / "broker.%p.out"
        valgrind = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
        valgrind.append(f"--callgrind-out-file={out}")
        command = [*valgrind, sys.executable, "-m", "vibemq_server"]
    env = {"VIBEMQ_QUEUE_DEFAULTS__DURABLE": "false", "PYTHONPATH": str(a.checkout.resolve())}
    broker = VibeMQBroker(command, env=env, mqtt=True)
    broker.start(timeout=300.0)
    runs: dict[str, list[dict[str, float]]] = {}
    try:
        for n in range(a.rounds):
            for path in paths:
                if a.callgrind is not None:
                    _callgrind(broker, "--instr=on")
                    _callgrind(broker, "--zero")
                before = snapshot(broker.pids())
                r = run_path(path, broker, a.messages, a.timeout)
                after = snapshot(broker.pids())
                if a.callgrind is not None:
                    _callgrind(broker, f"--dump=round{n + 1}-{path}")
                    _callgrind(broker, "--instr=off")
                per = {k: (after[k] - before.get(k, 0.0)) / max(1, r.delivered) for k in after}
                # (the generators' own CPU: on two shared cores they compete with the broker)
                per["pub_us"] = r.publisher_cpu_s / max(1, r.delivered) * 1e6
                per["sub_us"] = r.subscriber_cpu_s / max(1, r.delivered) * 1e6
                per["msg/read"] = 1 / per["syscr"] if per.get("syscr") else 0.0
                per["msg/write"] = 1 / per["syscw"] if per.get("syscw") else 0.0
                runs.setdefault(path, []).append(per)
                print(
                    f"round {n + 1} {path:6} {r.deliver_rate:,.0f} msg/s, broker "
                    f"{per.get('run_us', 0.0):.3f} us, {per['msg/read']:.0f} a read, "
                    f"{per['msg/write']:.0f} a write {r.errors or ''}"
                )
    finally:
        broker.stop()
    keys: tuple[str, ...] = ("syscr", "syscw", "rchar", "wchar", "voluntary", "nonvoluntary")
    keys += ("minflt",)
    keys += ("user_us", "sys_us", "cpu_us", "run_us", "pub_us", "sub_us", "msg/read", "msg/write")
    print(f"\n{'a message (medians)':20}" + "".join(f"{path:>12}" for path in runs))
    for key in keys:
        cells = "".join(
            f"{statistics.median(run.get(key, 0.0) for run in r):12.3f}" for r in runs.values()
        )
        print(f"{key:20}{cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
