"""Issue 15: many queues, one publisher and one subscriber each -- the curve.

For every queue count in ``--counts`` (1, 10, 100, 1,000, 10,000), a fresh ``vibemq-server``
(transient queues: ``durable: false`` in CreateQueue) and ``min(--processes, count)`` client
processes (20 by default); queue ``i`` belongs to process ``i % processes``. For each of its
queues a process opens a subscriber connection (CreateQueue RoundRobin, Subscribe with
``--prefetch``, an Ack for every delivery) and a publisher connection (pipelined, at most
``--window`` unacknowledged publishes per connection), so a count of N queues is 2N
connections; every connection of a process runs on one uvloop loop (``common``'s hot loops),
so a process serves its queues round-robin as their sockets become ready. ``--messages`` in
total, spread evenly over the queues; queue names of one width (every PublishAck, which
echoes the queue, is then of one size for the clients' run scanners). Each process encodes
its publishes, connects, subscribes and starts its loop before it reports ready, and all
start on one "go" read inside their loops, so the timed interval holds traffic only. Where
RLIMIT_NOFILE (hard) is too low for 2N connections
(20,000 here for 10,000 queues), ``--connections auto`` falls back to ``per-process``: one
subscriber connection per process subscribed to all of its queues and one publisher connection
publishing to them in turn; the table says which (the conns column).

Reported per count: the aggregate deliveries/s (every delivery / (last delivery anywhere -
first publish write anywhere)), the broker's CPU per message (µs, over the timed interval), its
RSS, and the rate relative to the 1-queue figure, medians of ``--rounds`` rounds in which the
counts alternate (the order rotates each round). ``--png`` plots the curve when matplotlib is
installed (it is not a dependency).

``--brokers vibemq,mosquitto`` measures Mosquitto's curve in the same run, each count on both
brokers in turn: a topic per queue, QoS 1 both ways (PUBACK for every publish and every
delivery, the native path's PublishAck and Ack), always ``per-process`` (one subscriber
connection subscribed to all of a process's topics, one publisher connection). Whether CPU
per message grows with the number of queues for a C broker too says how much of our growth is
the machine's caches.

Beside the rate and CPU per message, each measurement reports what explains a swing in the
CPU per message: the broker's read and write system calls per message (``/proc/PID/io``:
fewer publishes per read or deliveries per write cost more per message) and its involuntary
context switches (preempted by the client processes); its share of the interval on a CPU and
runnable but waiting for one (``schedstat``; its CPU per message is from the same ns
counter); the client processes' CPU per message (all of them) and messages per read. ``--json``
keeps per process its start, end, CPU, voluntary context switches and time waiting for a
CPU (``timeline``). ``--client-nice N`` runs the client
processes at that niceness and ``--pin`` keeps the broker on CPU 0 and the clients on the
others, so that the broker is not starved by its own load (steadier figures; the default
shape is unchanged). ``--processes`` keeps the issue's 20 by default.

``--baseline DIR`` runs another checkout's broker (``PYTHONPATH=DIR``) in turn with ours, as
broker ``baseline``. ``--acks queue``: the subscribers' Acks carry the Deliver's queue field,
as the client library's do (default ``bare``: an empty queue field).

    .venv/bin/python -m bench.many_queues --rounds 5 --json many-queues.json
    .venv/bin/python -m bench.many_queues --counts 1,100,1000 --messages 50000 --rounds 1
    .venv/bin/python -m bench.many_queues --connections per-process --counts 10,1000,10000 \
        --brokers vibemq,mosquitto --rounds 3 --messages 100000

Nothing here asserts on timings.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Callable, Coroutine
from functools import partial
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.brokers import Broker, MosquittoBroker, VibeMQBroker
from bench.common import (
    BenchError,
    PubStats,
    SubStats,
    consume_counting,
    encode_batches,
    expect_report,
    install_sigterm_exit,
    median_of,
    publish_pipelined,
    raise_nofile_limit,
    run_loop,
)
from bench.mqtt_driver import MqttDriver
from bench.stall_probe import schedstat
from bench.vibemq_driver import VibeDriver

COUNTS = (1, 10, 100, 1000, 10_000)


Driver = VibeDriver | MqttDriver


async def _ready_go(pipe: Connection, timeout: float) -> None:
    """Report "ready" and wait for "go" without leaving the loop: every process encodes its
    publishes, starts its loop and adopts its sockets before the parent starts any of them,
    so that the timed interval holds traffic, not 20 processes' set-up (which on two cores
    staggered their starts by 100-400 ms)."""
    pipe.send(("ready", None))
    loop = asyncio.get_running_loop()
    got: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not got.done():
            got.set_result(None)

    loop.add_reader(pipe.fileno(), wake)
    try:
        await asyncio.wait_for(got, timeout)
    except TimeoutError:
        raise BenchError("no 'go'") from None
    finally:
        loop.remove_reader(pipe.fileno())
    if pipe.recv()[0] != "go":
        raise BenchError("no 'go'")


async def _drive(
    subs: list[Coroutine[Any, Any, SubStats]],
    pubs: list[Callable[[asyncio.Future[None]], Coroutine[Any, Any, PubStats]]],
    pipe: Connection,
    timeout: float,
) -> dict[str, Any]:
    """Adopt every socket, report ready, and on "go" open the gate of every publisher."""
    sub_tasks = [asyncio.create_task(c) for c in subs]
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    pub_tasks = [asyncio.create_task(p(gate)) for p in pubs]
    for _ in range(3):  # the sockets' adoption takes a few loop turns
        await asyncio.sleep(0)
    await _ready_go(pipe, timeout)
    sys0 = proc_counters([os.getpid()])
    cpu0 = time.process_time()
    gate.set_result(None)
    pub_stats = await asyncio.gather(*pub_tasks)
    sub_stats = await asyncio.gather(*sub_tasks)
    return {
        "t_start_ns": min(p.t_start_ns for p in pub_stats),
        "t_end_ns": max(s.t_end_ns for s in sub_stats),
        "delivered": sum(s.delivered for s in sub_stats),
        "cpu_s": time.process_time() - cpu0,
        "sys": _since(sys0),
        "errors": sorted({e for st in (*pub_stats, *sub_stats) if (e := st.error)})[:3],
    }


def _per_queue(
    drivers: list[Driver],
    subs: list[Any],
    pubs: list[Any],
    per_queue: int,
    a: Any,
    pipe: Connection,
) -> Coroutine[Any, Any, dict[str, Any]]:
    """A publisher and a subscriber connection per queue."""
    window, batch, timeout = a
    encoded = [encode_batches(d, per_queue, batch) for d in drivers]
    return _drive(
        [
            consume_counting(c, per_queue, d.delivery_scanner(), timeout)
            for d, c in zip(drivers, subs, strict=True)
        ],
        [
            partial(publish_pipelined, c, b, s, min(window, per_queue), d.ack_counter(), timeout)
            for d, c, (b, s) in zip(drivers, pubs, encoded, strict=True)
        ],
        pipe,
        timeout,
    )


def _shared(
    drivers: list[Driver], sub: Any, pub: Any, per_queue: int, a: Any, pipe: Connection
) -> Coroutine[Any, Any, dict[str, Any]]:
    """One subscriber connection subscribed to every queue of the process, one publisher
    connection publishing to them in turn (message j to queue j mod n)."""
    window, batch, timeout = a
    n = len(drivers)
    total = per_queue * n
    frames = [drivers[j % n].publish_batch(j, 1) for j in range(total)]
    batches = [b"".join(frames[i : i + batch]) for i in range(0, total, batch)]
    sizes = [min(batch, total - i) for i in range(0, total, batch)]
    return _drive(
        [consume_counting(sub, total, drivers[0].delivery_scanner(), timeout)],
        [
            partial(
                publish_pipelined, pub, batches, sizes, window, drivers[0].ack_counter(), timeout
            )
        ],
        pipe,
        timeout,
    )


def proc_counters(pids: list[int]) -> dict[str, int]:
    """A process's (the broker's; a client's own) system calls (``/proc/PID/io``: syscr,
    syscw), context switches (voluntary, involuntary: every thread's ``/proc/PID/status``)
    and ns on a CPU and waiting for one (every thread's ``schedstat``: run_ns, wait_ns) so
    far."""
    out = dict.fromkeys(("syscr", "syscw", "vcs", "ivcs", "run_ns", "wait_ns"), 0)
    for pid in pids:
        run, wait = schedstat(pid)
        out["run_ns"] += run
        out["wait_ns"] += wait
        try:
            for line in Path(f"/proc/{pid}/io").read_text().splitlines():
                key, _, value = line.partition(":")
                if key in ("syscr", "syscw"):
                    out[key] += int(value)
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                key, _, value = line.partition(":")
                if key == "voluntary_ctxt_switches":
                    out["vcs"] += int(value)
                elif key == "nonvoluntary_ctxt_switches":
                    out["ivcs"] += int(value)
        except OSError:
            continue
    return out


def _since(before: dict[str, int]) -> dict[str, int]:
    """This process's ``proc_counters`` since ``before``."""
    now = proc_counters([os.getpid()])
    return {k: now[k] - before[k] for k in now}


def _place_client(nice: int, pin: bool) -> None:
    """A client process's niceness and CPUs (``--client-nice``, ``--pin``)."""
    if nice:
        os.nice(nice)
    cpus = os.sched_getaffinity(0)
    if pin and len(cpus) > 1:
        os.sched_setaffinity(0, cpus - {min(cpus)})


def worker_main(
    host: str,
    port: int,
    queues: list[str],
    per_queue: int,
    shared: bool,
    opts: Any,
    pipe: Connection,
    broker: str = "vibemq",
    ack_queue: bool = False,
    place: tuple[int, bool] = (0, False),
) -> None:
    try:
        _place_client(*place)
        prefetch = opts[0]
        drivers: list[Driver]
        if broker == "mosquitto":
            drivers = [MqttDriver(host, port, q) for q in queues]
        else:
            drivers = [
                VibeDriver(host, port, q, prefetch=prefetch, durable=False, ack_queue=ack_queue)
                for q in queues
            ]
        if shared:
            sub = drivers[0].connect_subscriber()
            for d in drivers[1:]:
                d.subscribe(sub)
            pub = drivers[0].connect_publisher()
            work = _shared(drivers, sub, pub, per_queue, opts[1:], pipe)
        else:
            subs = [d.connect_subscriber() for d in drivers]
            pubs = [d.connect_publisher() for d in drivers]
            work = _per_queue(drivers, subs, pubs, per_queue, opts[1:], pipe)
        pipe.send(("done", run_loop(work)))
    except Exception as exc:
        pipe.send(("error", f"worker: {exc!r}"))


def measure(count: int, a: argparse.Namespace, kind: str = "vibemq") -> dict[str, Any]:
    """One fresh broker (``kind``), ``count`` queues, the timed phase; a result dict."""
    broker: Broker
    if kind == "mosquitto":
        broker = MosquittoBroker(inflight=a.prefetch)
    else:
        extra = ["--max-connections", str(2 * count + 100), *a.server_arg]
        env = {"VIBEMQ_QUEUE_DEFAULTS__DURABLE": "false"}
        if kind == "baseline":  # (another checkout's broker: before/after in one run)
            env["PYTHONPATH"] = a.baseline
        broker = VibeMQBroker(extra_args=extra, env=env)
    nproc = min(a.processes, count)
    per_queue = max(1, a.messages // count)
    # per queue: 2 connections each; per process: 2 per process (when the fd limit is short)
    shared = (
        kind == "mosquitto"
        or a.connections == "per-process"
        or (a.connections == "auto" and 2 * count + 500 > a.nofile)
    )
    out: dict[str, Any] = {
        "broker": kind,
        "queues": count,
        "processes": nproc,
        "messages": per_queue * count,
    }
    out["connections"] = 2 * nproc if shared else 2 * count
    out["mode"] = "per-process" if shared else "per-queue"
    ctx = mp.get_context("spawn")
    procs: list[Any] = []
    pipes: list[Connection] = []
    try:
        broker.start()
        if a.pin:
            broker.pin({min(os.sched_getaffinity(0))})
        tag = os.urandom(3).hex()
        width = len(str(count - 1))
        for k in range(nproc):
            # names of one width: every PublishAck (it echoes the queue) and Deliver of a
            # connection is then of one size, which the clients' scanners take in runs
            queues = [f"mq-{tag}-{i:0{width}d}" for i in range(k, count, nproc)]
            rx, tx = ctx.Pipe()
            opts = (a.prefetch, a.window, a.batch, a.timeout)
            proc = ctx.Process(
                target=worker_main,
                args=(
                    broker.host,
                    broker.port,
                    queues,
                    per_queue,
                    shared,
                    opts,
                    tx,
                    kind,
                    a.acks == "queue",
                    (a.client_nice, a.pin),
                ),
            )
            proc.start()
            procs.append(proc)
            pipes.append(rx)
        t_setup = time.monotonic()
        for rx in pipes:
            expect_report(rx, "ready", a.timeout)
        out["setup_s"] = round(time.monotonic() - t_setup, 2)
        sys0 = proc_counters(broker.pids())
        for rx in pipes:
            rx.send(("go", None))
        results = [expect_report(rx, "done", a.timeout + 60) for rx in pipes]
        sys1 = proc_counters(broker.pids())
        # on a CPU (schedstat, ns: clock ticks were 10 % of these short intervals)
        cpu = (sys1["run_ns"] - sys0["run_ns"]) / 1e9
        out["broker_rss_kib"] = broker.rss_kib()
    except BenchError as exc:
        out["errors"] = [str(exc)]
        return out
    finally:
        try:
            for proc in procs:
                proc.join(timeout=10)
                if proc.is_alive():
                    proc.kill()
                    proc.join(timeout=5)
        finally:
            broker.stop()  # even when interrupted while joining the workers
    delivered = sum(r["delivered"] for r in results)
    t0 = min(r["t_start_ns"] for r in results)
    elapsed = (max(r["t_end_ns"] for r in results) - t0) / 1e9
    out.update(
        delivered=delivered,
        rate=delivered / elapsed if elapsed > 0 else 0.0,
        broker_cpu_s=cpu,
        cpu_us_per_msg=cpu / delivered * 1e6 if delivered else None,
        generator_cpu_s=round(sum(r["cpu_s"] for r in results), 2),
        client_us_per_msg=sum(r["cpu_s"] for r in results) / delivered * 1e6 if delivered else None,
        # the broker's time on a CPU and runnable but waiting for one (schedstat, in ns:
        # clock ticks are too coarse for these short intervals), shares of the interval;
        # the wait is what other runnable processes (its clients, the rest of the machine)
        # took from it, and it was idle for the rest
        **{
            f"broker_{name}_share": (sys1[k] - sys0[k]) / 1e9 / elapsed if elapsed > 0 else None
            for name, k in (("core", "run_ns"), ("wait", "wait_ns"))
        },
        # how far apart the processes started and finished, in ms (the ramps in elapsed)
        start_skew_ms=(
            max(r["t_start_ns"] for r in results) - min(r["t_start_ns"] for r in results)
        )
        / 1e6,
        end_skew_ms=(max(r["t_end_ns"] for r in results) - min(r["t_end_ns"] for r in results))
        / 1e6,
        elapsed_ms=elapsed * 1e3,
        # per process: start, end (ms from the first start), CPU ms, voluntary context
        # switches, ms runnable but waiting for a CPU
        timeline=[
            (
                round((r["t_start_ns"] - t0) / 1e6, 1),
                round((r["t_end_ns"] - t0) / 1e6, 1),
                round(r["cpu_s"] * 1e3, 1),
                r["sys"]["vcs"],
                round(r["sys"]["wait_ns"] / 1e6, 1),
            )
            for r in results
        ],
        **{
            f"client_{k}_per_msg": sum(r["sys"][k] for r in results) / delivered
            if delivered
            else None
            for k in ("syscr", "syscw", "vcs", "ivcs")
        },
        **{
            f"{k}_per_msg": (sys1[k] - sys0[k]) / delivered if delivered else None
            for k in ("syscr", "syscw", "vcs", "ivcs")
        },
        errors=[e for r in results for e in r["errors"]],
    )
    if delivered < out["messages"] and not out["errors"]:
        out["errors"].append(f"{out['messages'] - delivered} messages not delivered")
    return out


def summarize(runs: dict[tuple[str, int], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    rows = []
    for (kind, count), rs in runs.items():
        ok = [r for r in rs if not r.get("errors")]
        rows.append(
            {
                "broker": kind,
                "queues": count,
                "connections": rs[0]["connections"] if rs else None,
                "mode": rs[0]["mode"] if rs else None,
                "rate": median_of([r["rate"] for r in ok]),
                "cpu_us_per_msg": median_of([r["cpu_us_per_msg"] for r in ok]),
                "rss_mib": median_of([(r.get("broker_rss_kib") or 0) / 1024 for r in ok]),
                "setup_s": median_of([r["setup_s"] for r in ok]),
                **{k: median_of([r.get(k) for r in ok]) for k in _SYS_KEYS},
                "ok_runs": len(ok),
                "runs": len(rs),
            }
        )
    return rows


_SYS_KEYS = (
    "syscr_per_msg",
    "syscw_per_msg",
    "ivcs_per_msg",
    "client_us_per_msg",
    "broker_core_share",
    "broker_wait_share",
    "client_syscr_per_msg",
    "client_syscw_per_msg",
)


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _inverse(v: float | None) -> float | None:
    return 1 / v if v else None


def _per_k(v: float | None) -> float | None:
    return None if v is None else v * 1000


def print_table(rows: list[dict[str, Any]]) -> None:
    """Per broker: each count's rate against the first count's, and its CPU per message."""
    first: dict[str, dict[str, Any]] = {}
    for r in rows:
        first.setdefault(r["broker"], r)
    head = (
        f"{'broker':>9} {'queues':>7} {'conns':>7} {'msg/s':>10} {'vs first':>9} "
        f"{'broker us/msg':>14} {'vs first':>9} {'reads/msg':>9} {'writes/msg':>10} "
        f"{'preempt/kmsg':>12} {'broker RSS MiB':>15} {'setup s':>8} {'ok':>5} "
        f"{'broker core':>11} {'waits':>6} {'client us/msg':>13} {'client msg/read':>15}"
    )
    print()
    print(head)
    print("-" * len(head))
    for r in rows:
        base = first[r["broker"]]
        rel = f"{r['rate'] / base['rate']:.2f}x" if base["rate"] and r["rate"] else "-"
        cpu, cpu0 = r["cpu_us_per_msg"], base["cpu_us_per_msg"]
        crel = f"{cpu / cpu0:.2f}x" if cpu and cpu0 else "-"
        print(
            f"{r['broker']:>9} {r['queues']:>7,} {r['connections']:>7,} "
            f"{_fmt(r['rate'], ',.0f'):>10} {rel:>9} {_fmt(cpu, '.2f'):>14} {crel:>9} "
            f"{_fmt(r['syscr_per_msg'], '.4f'):>9} {_fmt(r['syscw_per_msg'], '.4f'):>10} "
            f"{_fmt(_per_k(r['ivcs_per_msg']), '.2f'):>12} {_fmt(r['rss_mib'], '.0f'):>15} "
            f"{_fmt(r['setup_s'], '.1f'):>8} "
            f"{r['ok_runs']:>2}/{r['runs']:<2} {_fmt(r['broker_core_share'], '.2f'):>11} "
            f"{_fmt(r['broker_wait_share'], '.2f'):>6} "
            f"{_fmt(r['client_us_per_msg'], '.2f'):>13} "
            f"{_fmt(_inverse(r['client_syscr_per_msg']), '.1f'):>15}"
        )
    print()
    print("medians of the successful rounds; broker us/msg over the timed interval;")
    print("'vs first': against the broker's first count in --counts; reads/writes: the")
    print("broker's read/write system calls per message; preempt/kmsg: its involuntary")
    print("context switches per 1,000 messages; broker core: its CPU seconds a second;")
    print("waits: its seconds a second runnable but waiting for a CPU (schedstat);")
    print("client us/msg: the client processes' CPU (all of them) a message; client")
    print("msg/read: messages for each of their read system calls (publishers' and")
    print("subscribers' reads together)")
    # at 1 queue the two are the same; Mosquitto is always per-process
    modes = {r["mode"] for r in rows if r["queues"] > 1 and r["broker"] == "vibemq"}
    if len(modes) > 1:
        print("note: per-queue and per-process connections mixed (RLIMIT_NOFILE); for one")
        print("curve of a kind run with --connections per-process")


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("--png: matplotlib is not installed; no plot", flush=True)
        return
    rows = [r for r in rows if r["broker"] == "vibemq"]
    xs = [r["queues"] for r in rows if r["rate"]]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(xs, [r["rate"] for r in rows if r["rate"]], "o-", label="msg/s")
    ax.set_xscale("log")
    ax.set_xlabel("queues (one publisher and one subscriber each)")
    ax.set_ylabel("aggregate deliveries/s")
    ax2 = ax.twinx()
    ax2.plot(xs, [r["cpu_us_per_msg"] for r in rows if r["rate"]], "s--", color="tab:red")
    ax2.set_ylabel("broker CPU µs per message", color="tab:red")
    fig.tight_layout()
    fig.savefig(path)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add = p.add_argument
    add("--counts", default=",".join(map(str, COUNTS)), help="queue counts (comma list)")
    add("--processes", type=int, default=20, help="client processes (at most one per queue)")
    add("--messages", type=int, default=200_000, help="in total per measurement")
    add("--rounds", type=int, default=5)
    add("--window", type=int, default=1000, help="unacked publishes per publisher connection")
    add("--batch", type=int, default=100, help="publishes per write")
    add("--prefetch", type=int, default=1000)
    add("--timeout", type=float, default=300.0, help="per measurement, s")
    add(
        "--connections",
        choices=("auto", "per-queue", "per-process"),
        default="auto",
        help="per-queue: a publisher and a subscriber connection per queue (2N);\n"
        "per-process: one of each per process, subscribed to / publishing over all its\n"
        "queues; auto: per-queue unless RLIMIT_NOFILE is too low for 2N",
    )
    add(
        "--brokers",
        default="vibemq",
        help="comma list of vibemq, mosquitto: each count on each in turn (Mosquitto: a\n"
        "topic per queue, QoS 1, always per-process connections)",
    )
    add("--server-arg", action="append", default=[], help="extra vibemq-server argument")
    add(
        "--baseline",
        help="also run VibeMQ from this checkout (PYTHONPATH=DIR) as broker 'baseline',\n"
        "in turn with the others: before/after in one run",
    )
    add(
        "--acks",
        choices=("queue", "bare"),
        default="bare",
        help="bare: an empty queue field in each Ack (the broker finds the subscription by\n"
        "its per-connection map); queue: the Deliver's queue field, as the client library\n"
        "sends it (today's broker ignores it)",
    )
    add(
        "--client-nice",
        type=int,
        default=0,
        help="run the client processes at this niceness (e.g. 10: the broker is not starved\n"
        "by its own load generators; 0: unchanged)",
    )
    add(
        "--pin",
        action="store_true",
        help="the broker on the first CPU, the client processes on the others",
    )
    add("--json", type=Path)
    add("--png", type=Path, help="plot the curve here (only if matplotlib is installed)")
    a = p.parse_args(argv)
    counts = [int(c) for c in a.counts.split(",") if c.strip()]
    if not counts or min(counts) < 1 or min(a.processes, a.messages, a.rounds) < 1:
        p.error("counts, --processes, --messages, --rounds must be positive")
    kinds = [k.strip() for k in a.brokers.split(",") if k.strip()]
    if not kinds or not set(kinds) <= {"vibemq", "mosquitto"}:
        p.error("--brokers: a comma list of vibemq, mosquitto")
    if a.baseline:
        kinds.append("baseline")
    install_sigterm_exit()
    a.nofile = raise_nofile_limit()
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {(k, c): [] for k in kinds for c in counts}
    for rnd in range(a.rounds):
        shift = rnd % len(counts)
        order = kinds if rnd % 2 == 0 else kinds[::-1]
        for count, kind in [(c, k) for c in counts[shift:] + counts[:shift] for k in order]:
            r = measure(count, a, kind)
            runs[kind, count].append(r)
            cpu = r.get("cpu_us_per_msg")
            print(
                f"round {rnd + 1} {kind:>9} {count:>6,} queues ({r['connections']:,} connections):"
                f" {r.get('rate', 0):>10,.0f} msg/s"
                + (f"  broker {cpu:.2f} us/msg" if cpu is not None else "")
                + (
                    f"  r/w per msg {r['syscr_per_msg']:.4f}/{r['syscw_per_msg']:.4f}"
                    f"  preempt/kmsg {r['ivcs_per_msg'] * 1000:.2f}"
                    if r.get("syscr_per_msg") is not None
                    else ""
                )
                + (
                    f"  broker core {r['broker_core_share']:.2f} waits {r['broker_wait_share']:.2f}"
                    f"  clients {r['client_us_per_msg']:.2f} us/msg"
                    f" r/w per msg {r['client_syscr_per_msg']:.4f}"
                    f"/{r['client_syscw_per_msg']:.4f}"
                    if r.get("client_us_per_msg") is not None
                    else ""
                )
                + (
                    f"  ms: elapsed {r['elapsed_ms']:.0f} start/end skew {r['start_skew_ms']:.0f}"
                    f"/{r['end_skew_ms']:.0f}"
                    if r.get("elapsed_ms") is not None
                    else ""
                )
                + f"  setup {r.get('setup_s', 0):.1f}s"
                + (f"  ERRORS: {'; '.join(r['errors'])}" if r.get("errors") else ""),
                flush=True,
            )
    rows = summarize(runs)
    print_table(rows)
    if a.png:
        plot(rows, a.png)
    if a.json:
        doc = {
            "settings": {k: str(v) for k, v in vars(a).items()},
            "median": rows,
            "runs": {f"{k} {c}": rs for (k, c), rs in runs.items()},
        }
        a.json.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {a.json}")
    return 1 if any(r["ok_runs"] < r["runs"] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
