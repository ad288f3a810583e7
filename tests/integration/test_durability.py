"""Durability of real ``vibemq-server`` processes: clean restarts, ``kill -9`` loops and damage.

Every server here is a separate process (``python -m vibemq_server``) on port 0 with a ready
file; its stderr goes to a log file so nothing can block on a full pipe. Every process is killed
in the fixture's teardown whatever happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from rawclient import Closed, RawClient, assert_error, assert_ok
from serverproc import START_TIMEOUT, ServerProc, Servers

from vibemq_server.journal.records import (
    SEGMENT_HEADER_SIZE,
    Publish,
    encode_record,
    iter_records,
)
from vibemq_server.protocol import CommandType, Message
from vibemq_server.protocol.codec import encode

T = CommandType


def _trouble(text: str) -> list[str]:
    """The warning and error lines of a broker's log (the last 20)."""
    return [line for line in text.splitlines() if '"warning"' in line or '"error"' in line][-20:]


def log_events(text: str) -> list[dict[str, object]]:
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


def info_of(reply: Message) -> dict[str, object]:
    assert_ok(reply, T.QUEUE_INFO)
    info = json.loads(reply.payload)
    assert isinstance(info, dict)
    return info


async def queue_names(c: RawClient) -> list[str]:
    reply = assert_ok(await c.list_queues(), T.LIST_QUEUES)
    names = json.loads(reply.payload)
    assert isinstance(names, list)
    return names


OPTION_KEYS = (
    "deliveryMode",
    "maxSize",
    "messageTtl",
    "overflowStrategy",
    "enableDeadLetterQueue",
    "deadLetterQueueName",
    "maxRetryAttempts",
    "ackTimeout",
    "createdAt",
)


def options_of(info: dict[str, object]) -> dict[str, object]:
    return {k: info[k] for k in OPTION_KEYS}


async def publish_all(c: RawClient, queue: str, ids: list[str], payload: object = None) -> None:
    """Pipeline publishes and require a PublishAck for every one."""
    for mid in ids:
        c.send(c.publish_msg(queue, payload if payload is not None else {"id": mid}, msg_id=mid))
    for mid in ids:
        assert_ok(await c.reply_to(mid), T.PUBLISH_ACK)


async def settle_ping(c: RawClient) -> None:
    """A Pong after earlier frames of the same connection means the server has run them."""
    assert_ok(await c.ping(), T.PONG)


async def poll_info(c: RawClient, queue: str, pred, timeout: float = 5.0) -> dict[str, object]:
    """QueueInfo of ``queue`` until ``pred(info)`` holds (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        info = info_of(await c.queue_info(queue))
        if pred(info):
            return info
        assert time.monotonic() < deadline, f"condition never held: {info}"
        await asyncio.sleep(0.05)


# -- 1. clean restart --------------------------------------------------------------------------

ORDERS_OPTS = {
    "deliveryMode": "RoundRobin",
    "maxQueueSize": 500,
    "messageTtl": 0,
    "enableDeadLetterQueue": True,
    "overflowStrategy": "DropNewest",
    "maxRetryAttempts": 5,
}
JOBS_OPTS = {
    "deliveryMode": "PriorityBased",
    "maxQueueSize": 50,
    "enableDeadLetterQueue": True,
    "overflowStrategy": "RedirectToDlq",
    "maxRetryAttempts": 1,
    "ackTimeout": 60000,
}
TTL_MS = 2500
TTL_OPTS = {
    "deliveryMode": "RoundRobin",
    "maxQueueSize": 100,
    "messageTtl": TTL_MS,
    "enableDeadLetterQueue": True,
    "overflowStrategy": "DropOldest",
    "maxRetryAttempts": 2,
}


async def test_restart_keeps_options_messages_attempts_dlq_and_deletions(
    tmp_path: Path, servers: Servers
) -> None:
    data = tmp_path / "data"
    srv = await servers.start(data, "--fsync", "always")
    c = await RawClient.connected(srv.port)
    for name, opts in (("orders", ORDERS_OPTS), ("jobs", JOBS_OPTS), ("ttl", TTL_OPTS)):
        assert_ok(await c.create_queue(name, options=opts), T.CREATE_QUEUE)
    assert_ok(await c.create_queue("doomed"), T.CREATE_QUEUE)

    orders = [f"o{i}" for i in range(1, 11)]
    await publish_all(c, "orders", orders)
    await publish_all(c, "jobs", ["j1", "j2"])
    await publish_all(c, "doomed", ["d1", "d2"])
    assert_ok(await c.delete_queue("doomed"), T.DELETE_QUEUE)

    # orders (prefetch 6): o1..o3 acked, o4..o9 delivered and left unacked, o10 never delivered.
    cons = await RawClient.connected(srv.port)
    assert_ok(await cons.subscribe("orders", prefetch=6), T.SUBSCRIBE_ACK)
    got = await cons.deliveries(6, "orders")
    assert [d.id for d in got] == orders[:6]
    for d in got[:3]:
        cons.ack(d.id)
    got += await cons.deliveries(3, "orders")  # the acks made room for three more
    assert [d.id for d in got] == orders[:9]
    assert all(d.headers["deliveryAttempts"] == "1" for d in got)
    await settle_ping(cons)

    # jobs (maxRetryAttempts 1): delivered once, returned unacked -> dead-lettered to jobs.dlq.
    jc = await RawClient.connected(srv.port)
    assert_ok(await jc.subscribe("jobs"), T.SUBSCRIBE_ACK)
    assert {d.id for d in await jc.deliveries(2, "jobs")} == {"j1", "j2"}
    assert_ok(await jc.unsubscribe("jobs"), T.UNSUBSCRIBE_ACK)
    dlq_info = await poll_info(c, "jobs.dlq", lambda i: i["messageCount"] == 2)

    before = {q: info_of(await c.queue_info(q)) for q in ("orders", "jobs", "ttl", "jobs.dlq")}
    assert before["orders"]["messageCount"] == 1 and before["orders"]["unackedCount"] == 6
    assert before["jobs"]["messageCount"] == 0

    # ttl: published now; the broker will be down for longer than the TTL.
    await publish_all(c, "ttl", ["t1", "t2", "t3"])
    published_ttl_at = time.monotonic()
    await publish_all(c, "ttl", ["t_later"], payload={"late": True})  # same TTL, expires too

    assert await srv.stop() == 0, srv.log
    for cl in (c, cons, jc):
        await cl.close()
    remaining = TTL_MS / 1000 + 0.2 - (time.monotonic() - published_ttl_at)
    if remaining > 0:
        await asyncio.sleep(remaining)

    # -- second life ------------------------------------------------------------------------------
    srv = await servers.start(data, "--fsync", "always")
    started = time.monotonic()
    c = await RawClient.connected(srv.port)
    # TTL is by wall clock at publish: they expired while the broker was down, so they go at the
    # first tick, well before a TTL counted from the restart could have run out.
    ttl_info = await poll_info(c, "ttl", lambda i: i["messageCount"] == 0, timeout=TTL_MS / 1000)
    assert time.monotonic() - started < TTL_MS / 1000
    assert ttl_info["stats"]["expired"] == 4  # type: ignore[index]

    names = await queue_names(c)
    assert "doomed" not in names, names
    assert_error(await c.queue_info("doomed"), "QUEUE_NOT_FOUND")
    assert {"orders", "jobs", "ttl", "jobs.dlq", "ttl.dlq"} <= set(names), names

    after = {q: info_of(await c.queue_info(q)) for q in ("orders", "jobs", "ttl", "jobs.dlq")}
    for q in after:
        assert options_of(after[q]) == options_of(before[q]), q
    assert after["orders"]["deliveryMode"] == "RoundRobin"
    assert after["orders"]["maxSize"] == 500
    assert after["orders"]["overflowStrategy"] == "DropNewest"
    assert after["orders"]["maxRetryAttempts"] == 5
    assert after["orders"]["deadLetterQueueName"] == "orders.dlq"
    assert after["jobs"]["deliveryMode"] == "PriorityBased"
    assert after["jobs"]["overflowStrategy"] == "RedirectToDlq"
    assert after["jobs"]["ackTimeout"] == 60000
    assert after["ttl"]["messageTtl"] == TTL_MS
    # Acked messages are gone; the 3 unacked are back in the queue with the 4 never delivered.
    assert after["orders"]["messageCount"] == 7
    assert after["orders"]["unackedCount"] == 0
    assert after["jobs"]["messageCount"] == 0
    assert after["jobs.dlq"]["messageCount"] == dlq_info["messageCount"] == 2

    cons = await RawClient.connected(srv.port)
    assert_ok(await cons.subscribe("orders", prefetch=100), T.SUBSCRIBE_ACK)
    got = await cons.deliveries(7, "orders")
    await cons.expect_nothing(lambda m: m.type is T.DELIVER, 0.3)
    assert [d.id for d in got] == orders[3:]
    attempts = {d.id: d.headers["deliveryAttempts"] for d in got}
    assert attempts == {f"o{i}": "2" for i in range(4, 10)} | {"o10": "1"}
    assert json.loads(got[0].payload) == {"id": "o4"}
    # o4 acked now; the others stay delivered and unacked into the third life.
    cons.ack("o4")
    await settle_ping(cons)

    dc = await RawClient.connected(srv.port)
    assert_ok(await dc.subscribe("jobs.dlq"), T.SUBSCRIBE_ACK)
    dead = await dc.deliveries(2, "jobs.dlq")
    assert {d.id for d in dead} == {"j1", "j2"}
    for d in dead:
        assert d.headers["deadLetterReason"] == "MaxRetriesExceeded"
        assert d.headers["originalQueue"] == "jobs"
        assert d.headers["originalDeliveryAttempts"] == "1"
    # ttl.dlq holds the expired messages.
    tc = await RawClient.connected(srv.port)
    assert_ok(await tc.subscribe("ttl.dlq"), T.SUBSCRIBE_ACK)
    expired = await tc.deliveries(4, "ttl.dlq")
    assert {d.id for d in expired} == {"t1", "t2", "t3", "t_later"}
    assert all(d.headers["deadLetterReason"] == "MessageExpired" for d in expired)
    for d in expired:
        tc.ack(d.id)
    await settle_ping(tc)

    assert await srv.stop() == 0, srv.log
    for cl in (c, cons, dc, tc):
        await cl.close()

    # -- third life: attempts keep counting, acks of the second life stay acked ------------------
    srv = await servers.start(data, "--fsync", "always")
    c = await RawClient.connected(srv.port)
    info = info_of(await c.queue_info("orders"))
    assert options_of(info) == options_of(before["orders"])
    assert info["messageCount"] == 6
    assert info_of(await c.queue_info("ttl.dlq"))["messageCount"] == 0
    assert info_of(await c.queue_info("jobs.dlq"))["messageCount"] == 2  # delivered, never acked
    assert "doomed" not in await queue_names(c)
    assert_ok(await c.subscribe("orders", prefetch=100), T.SUBSCRIBE_ACK)
    got = await c.deliveries(6, "orders")
    await c.expect_nothing(lambda m: m.type is T.DELIVER, 0.3)
    assert [d.id for d in got] == orders[4:]
    attempts = {d.id: d.headers["deliveryAttempts"] for d in got}
    assert attempts == {f"o{i}": "3" for i in range(5, 10)} | {"o10": "2"}
    assert await srv.stop() == 0, srv.log
    await c.close()


async def test_a_message_parked_behind_a_reused_id_survives_a_restart(
    tmp_path: Path, servers: Servers
) -> None:
    """A publish whose id its subscriber still holds waits parked on that subscriber (the
    messages behind it go on); it is still a message of the queue for the journal: after a
    restart it is ready again, and delivered once the first of its id is acked."""
    data = tmp_path / "data"
    srv = await servers.start(data, "--fsync", "always")
    c = await RawClient.connected(srv.port)
    cons = await RawClient.connected(srv.port)
    assert_ok(await cons.subscribe("reused", prefetch=10), T.SUBSCRIBE_ACK)
    for n, mid in enumerate(["x", "x", "a"]):
        assert_ok(await c.publish("reused", {"n": n}, msg_id=mid), T.PUBLISH_ACK)
    got = await cons.deliveries(2, "reused")
    assert [(d.id, json.loads(d.payload)["n"]) for d in got] == [("x", 0), ("a", 2)]
    info = await poll_info(c, "reused", lambda i: i["unackedCount"] == 2)
    assert info["messageCount"] == 1  # the parked one counts as ready
    assert await srv.stop() == 0, srv.log
    for cl in (c, cons):
        await cl.close()

    srv = await servers.start(data, "--fsync", "always")
    c = await RawClient.connected(srv.port)
    assert info_of(await c.queue_info("reused"))["messageCount"] == 3
    assert_ok(await c.subscribe("reused", prefetch=10), T.SUBSCRIBE_ACK)
    got = await c.deliveries(2, "reused")
    assert [(d.id, json.loads(d.payload)["n"]) for d in got] == [("x", 0), ("a", 2)]
    c.ack("x")
    (last,) = await c.deliveries(1, "reused")
    assert json.loads(last.payload)["n"] == 1 and last.headers["deliveryAttempts"] == "1"
    assert await srv.stop() == 0, srv.log
    await c.close()


# -- 2. kill -9 loop ---------------------------------------------------------------------------

STRESS = "stress"
MARKERS = "markers"
STRESS_OPTS = {
    "deliveryMode": "RoundRobin",
    "maxQueueSize": 1_000_000,
    "messageTtl": 0,
    "enableDeadLetterQueue": False,
    "overflowStrategy": "DropNewest",
    "maxRetryAttempts": 1000,
    "ackTimeout": 600_000,
}
ITERATIONS = 20
SEED = 20240601
LINK_ERRORS = (Closed, ConnectionError, OSError, asyncio.IncompleteReadError)


@dataclass
class Ledger:
    sent: set[str] = field(default_factory=set)  # every publish written to a socket
    publish_acked: set[str] = field(default_factory=set)
    publish_errors: list[Message] = field(default_factory=list)
    ack_sent: set[str] = field(default_factory=set)  # acks written; may or may not have landed
    certainly_acked: set[str] = field(default_factory=set)
    # Deliveries the journal certainly recorded (a later fsync covered them): id -> attempts.
    recorded_attempts: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    deliveries: int = 0


async def run_publisher(port: int, it: int, ledger: Ledger) -> None:
    window = 64
    outstanding: set[str] = set()
    n = 0
    try:
        c = await RawClient.connected(port)
    except LINK_ERRORS:
        return
    try:
        while True:
            while len(outstanding) < window:
                mid = f"p{it}_{n}"
                n += 1
                ledger.sent.add(mid)
                outstanding.add(mid)
                c.send(c.publish_msg(STRESS, {"id": mid, "pad": "x" * 200}, msg_id=mid))
            await c.writer.drain()
            reply = await c.recv(timeout=10)
            if reply.type is T.PUBLISH_ACK and reply.id in outstanding:
                ledger.publish_acked.add(reply.id)
                outstanding.discard(reply.id)
            elif reply.type is T.ERROR:
                ledger.publish_errors.append(reply)
                outstanding.discard(reply.id)
            else:
                ledger.violations.append(f"publisher got unexpected {reply}")
    except LINK_ERRORS:
        return
    finally:
        await c.close()


async def run_consumer(port: int, it: int, ledger: Ledger, rng: random.Random) -> None:
    try:
        c = await RawClient.connected(port)
        assert_ok(await c.subscribe(STRESS, prefetch=500), T.SUBSCRIBE_ACK)
    except LINK_ERRORS:
        return
    marker = 0
    try:
        while True:
            first = await c.delivery(STRESS, timeout=10)
            batch = [first]
            batch += [m for m in c.pending if m.type is T.DELIVER and m.queue == STRESS]
            c.pending = [m for m in c.pending if m not in batch]
            acked: list[str] = []
            seen: dict[str, int] = {}
            for d in batch:
                ledger.deliveries += 1
                attempts = int(d.headers["deliveryAttempts"])
                if d.id not in ledger.sent:
                    ledger.violations.append(f"delivered {d.id!r} that was never published")
                if d.id in ledger.certainly_acked:
                    ledger.violations.append(f"{d.id!r} delivered again after a certain ack")
                floor = ledger.recorded_attempts.get(d.id)
                if floor is not None and attempts <= floor:
                    ledger.violations.append(
                        f"{d.id!r} redelivered with deliveryAttempts {attempts} <= {floor}"
                    )
                seen[d.id] = attempts
                if rng.random() < 0.75:
                    c.ack(d.id)
                    ledger.ack_sent.add(d.id)
                    acked.append(d.id)
            # A durable publish after the acks: its PublishAck means an fsync covered the
            # earlier settle (and deliver) records of this connection, journal order being
            # the order the server ran them in.
            marker += 1
            mid = f"mk{it}_{marker}"
            c.send(c.publish_msg(MARKERS, {}, msg_id=mid))
            reply = await c.reply_to(mid, timeout=10)
            if reply.type is T.PUBLISH_ACK:
                ledger.certainly_acked.update(acked)
                for mid2, attempts in seen.items():
                    if mid2 not in acked:
                        ledger.recorded_attempts[mid2] = attempts
            else:
                ledger.violations.append(f"marker refused: {reply}")
    except LINK_ERRORS:
        return
    finally:
        await c.close()


async def test_kill_9_loop_loses_no_acknowledged_publish_and_resurrects_no_ack(
    tmp_path: Path, servers: Servers
) -> None:
    data = tmp_path / "data"
    flags = ("--fsync", "always", "--segment-size", "65536")
    rng = random.Random(SEED)
    ledger = Ledger()
    srv = await servers.start(data, *flags)
    c = await RawClient.connected(srv.port)
    assert_ok(await c.create_queue(STRESS, options=STRESS_OPTS), T.CREATE_QUEUE)
    assert_ok(await c.create_queue(MARKERS), T.CREATE_QUEUE)
    # A durable publish makes the queue definitions durable too (same ordered journal).
    await publish_all(c, MARKERS, ["setup"])
    options = options_of(info_of(await c.queue_info(STRESS)))
    await c.close()
    await srv.kill()

    restarts = []
    for it in range(ITERATIONS):
        t0 = time.monotonic()
        srv = await servers.start(data, *flags)
        restarts.append(time.monotonic() - t0)
        probe = await RawClient.connected(srv.port)
        assert options_of(info_of(await probe.queue_info(STRESS))) == options, it
        await probe.close()
        sub_rng = random.Random(rng.random())
        tasks = [
            asyncio.create_task(run_publisher(srv.port, it, ledger)),
            asyncio.create_task(run_consumer(srv.port, it, ledger, sub_rng)),
        ]
        await asyncio.sleep(rng.uniform(0.0, 0.3))
        await srv.kill()
        done, pending = await asyncio.wait(tasks, timeout=10)
        for task in pending:
            task.cancel()
        assert not pending, f"iteration {it}: client tasks did not end after the kill"
        for task in done:
            task.result()  # re-raise assertion/timeouts of the client tasks
        # (the broker's warnings and errors of this iteration say why, if it refused one)
        assert not ledger.violations, (ledger.violations[:10], _trouble(srv.log))
    # (No bound on the loop's time: it is bounded by ITERATIONS and pytest's timeout; a timed
    # assertion failed here only on a loaded machine.)

    # -- final: restart and drain everything ---------------------------------------------------
    srv = await servers.start(data, *flags)
    c = await RawClient.connected(srv.port)
    info = info_of(await c.queue_info(STRESS))
    assert options_of(info) == options
    assert info["unackedCount"] == 0
    count = info["messageCount"]
    assert isinstance(count, int)
    final = await drain(c, srv, count)
    await c.expect_nothing(lambda m: m.type is T.DELIVER, 0.5)
    ids = [d.id for d in final]
    for d in final:
        attempts = int(d.headers["deliveryAttempts"])
        floor = ledger.recorded_attempts.get(d.id)
        assert floor is None or attempts > floor, (d.id, attempts, floor)
    assert await srv.stop() == 0, srv.log
    await c.close()

    present = set(ids)
    print(
        f"kill loop: {len(ledger.sent)} sent, {len(ledger.publish_acked)} publish-acked, "
        f"{ledger.deliveries} deliveries, {len(ledger.ack_sent)} acks sent, "
        f"{len(ledger.certainly_acked)} certain, {len(present)} left, "
        f"segments now {len(segments(data))}, restart max {max(restarts):.2f}s"
    )
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    assert not dupes, f"delivered more than once in the final drain: {dupes[:10]}"
    assert not ledger.publish_errors, ledger.publish_errors[:5]
    never_published = present - ledger.sent
    assert not never_published, sorted(never_published)[:10]
    resurrected = present & ledger.certainly_acked
    assert not resurrected, f"certainly acked, yet back: {sorted(resurrected)[:10]}"
    # Every acknowledged publish is still there, or it was consumed and an ack was sent (an
    # ack not yet confirmed may or may not have reached the journal: either is correct).
    lost = ledger.publish_acked - present - ledger.ack_sent
    assert not lost, f"{len(lost)} acknowledged publishes lost: {sorted(lost)[:10]}"
    # The test did real work.
    assert len(ledger.publish_acked) > 200, len(ledger.publish_acked)
    assert len(ledger.certainly_acked) > 50, len(ledger.certainly_acked)
    assert max(restarts) < START_TIMEOUT


#: the final drain's subscription: the broker's largest prefetch
DRAIN_PREFETCH = 65_535
#: how long the final drain waits for any one delivery before it calls the queue stuck (a
#: hang detector, not a speed bound: a loaded 2-core runner can pause a broker that fsyncs
#: every write for seconds)
DRAIN_WAIT = 30.0


async def drain(c: RawClient, srv: ServerProc, count: int) -> list[Message]:
    """All ``count`` messages of STRESS, unacked while the subscription has room. A
    backlog larger than the prefetch is acked a prefetch at a time (what makes room must
    wake the queue: that is tested too). A stuck queue fails with what the broker says."""
    assert_ok(await c.subscribe(STRESS, prefetch=DRAIN_PREFETCH), T.SUBSCRIBE_ACK)
    final: list[Message] = []
    held = 0
    while len(final) < count:
        try:
            d = await c.delivery(STRESS, timeout=DRAIN_WAIT)
        except TimeoutError:
            raise AssertionError(await _stuck(srv, count, final, held)) from None
        final.append(d)
        held += 1
        if held == DRAIN_PREFETCH:
            for each in final[-held:]:
                c.ack(each.id)
            held = 0
    return final


async def _stuck(srv: ServerProc, count: int, final: list[Message], held: int) -> str:
    """Why the final drain waited: the queue as the broker sees it, and its log."""
    probe = await RawClient.connected(srv.port)
    try:
        info = info_of(await probe.queue_info(STRESS))
    finally:
        await probe.close()
    return (
        f"no delivery for {DRAIN_WAIT}s after {len(final)} of {count} ({held} unacked); "
        f"the broker's queue: {info}; its log: {_trouble(srv.log)}"
    )


async def test_an_error_between_durable_publishes_keeps_its_place(
    tmp_path: Path, servers: Servers
) -> None:
    """A refused frame between two durable publishes of one read: its Error waits in their
    PublishAcks' batch and comes out between them, in the frames' order."""
    srv = await servers.start(tmp_path / "data", "--fsync", "always")
    c = await RawClient.connected(srv.port)
    frames = [c.publish_msg("ordered", {}, msg_id=f"p{i}") for i in range(1, 200)]
    frames.insert(1, Message(T.PUBLISH, "bad", "ordered", b"{not json"))
    c.send_raw(b"".join(encode(m) for m in frames))
    assert assert_ok(await c.recv(), T.PUBLISH_ACK).id == "p1"
    assert_error(await c.recv(), "INVALID_PAYLOAD", "bad")
    for i in range(2, 200):
        assert assert_ok(await c.recv(), T.PUBLISH_ACK).id == f"p{i}"


async def test_a_long_lived_message_does_not_pin_the_whole_journal(
    tmp_path: Path, servers: Servers
) -> None:
    """One message nobody consumes (say, in a dead-letter queue) must not keep every later,
    fully settled segment on disk: the journal has to stay bounded by its live data."""
    data = tmp_path / "data"
    flags = ("--fsync", "always", "--segment-size", "4096")
    srv = await servers.start(data, *flags)
    c = await RawClient.connected(srv.port)
    await publish_all(c, "parked", ["parked1"])
    await c.close()
    assert await srv.stop() == 0, srv.log  # segment 1: one publish, still live

    srv = await servers.start(data, *flags)
    c = await RawClient.connected(srv.port)
    assert_ok(await c.subscribe("work", prefetch=1000), T.SUBSCRIBE_ACK)
    work = [f"w{i}" for i in range(300)]
    peak = 0
    for i in range(0, len(work), 10):  # a batch a round: the segment rotates every round
        await publish_all(c, "work", work[i : i + 10], payload={"pad": "y" * 1000})
        for d in await c.deliveries(10, "work"):
            c.ack(d.id)
        peak = max(peak, int(segments(data)[-1].stem))
    await publish_all(c, "work-done", ["done"])  # the acks are durable now
    # Many segments were written (reclamation may already have removed some meanwhile).
    assert peak > 20, peak
    deadline = time.monotonic() + 5
    while len(segments(data)) > 10 and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    left = segments(data)
    await c.close()
    assert await srv.stop() == 0, srv.log

    srv = await servers.start(data, *flags)
    c = await RawClient.connected(srv.port)
    assert info_of(await c.queue_info("parked"))["messageCount"] == 1
    assert info_of(await c.queue_info("work"))["messageCount"] == 0
    await c.close()
    assert await srv.stop() == 0, srv.log
    assert len(left) <= 10, (
        f"{len(left)} of {peak} segments still on disk although only 'parked1' (in "
        f"{left[0].name}) and 'done' are live: reclamation is stuck behind the oldest segment"
    )


# -- 3. damage ---------------------------------------------------------------------------------


def segments(data: Path) -> list[Path]:
    return sorted((data / "journal").glob("*.seg"))


def record_offsets(path: Path) -> list[tuple[int, int, object]]:
    raw = path.read_bytes()
    return [(e.offset, e.size, e.record) for e in iter_records(raw, SEGMENT_HEADER_SIZE, str(path))]


async def fill_and_stop(servers: Servers, data: Path, n: int) -> None:
    srv = await servers.start(data, "--fsync", "always")
    c = await RawClient.connected(srv.port)
    assert_ok(await c.create_queue("q", options={"maxQueueSize": 1000}), T.CREATE_QUEUE)
    await publish_all(c, "q", [f"m{i}" for i in range(n)])
    await c.close()
    assert await srv.stop() == 0, srv.log


async def test_damage_in_the_middle_refuses_to_start_naming_file_and_offset(
    tmp_path: Path, servers: Servers
) -> None:
    data = tmp_path / "data"
    await fill_and_stop(servers, data, 30)
    (seg,) = segments(data)
    records = record_offsets(seg)
    publishes = [(off, size) for off, size, rec in records if isinstance(rec, Publish)]
    assert len(publishes) == 30
    off, size = publishes[15]  # valid records follow it
    raw = bytearray(seg.read_bytes())
    flip_at = off + size - 3  # inside the payload
    raw[flip_at] ^= 0xFF
    seg.write_bytes(bytes(raw))

    rc, log = await servers.run_to_exit(data, "--fsync", "always")
    assert rc != 0, log
    assert str(seg) in log, log
    assert f"at offset {off}" in log, log
    assert "checksum mismatch" in log, log
    errors = [e for e in log_events(log) if e.get("level") == "error"]
    assert errors, log
    # Nothing was cut: the damaged file is left as it was for the operator.
    assert seg.read_bytes() == bytes(raw)

    # Moving the file away (as the message says) lets the broker start without it.
    seg.rename(tmp_path / "moved.seg")
    srv = await servers.start(data, "--fsync", "always")
    c = await RawClient.connected(srv.port)
    assert_error(await c.queue_info("q"), "QUEUE_NOT_FOUND")
    await c.close()
    assert await srv.stop() == 0


async def test_damage_in_an_older_segment_refuses_even_at_its_end(
    tmp_path: Path, servers: Servers
) -> None:
    data = tmp_path / "data"
    await fill_and_stop(servers, data, 10)
    srv = await servers.start(data, "--fsync", "always")  # a second segment
    assert await srv.stop() == 0, srv.log
    first, last = segments(data)
    size = first.stat().st_size
    with first.open("r+b") as fh:
        fh.truncate(size - 5)  # looks torn, but a newer segment follows
    rc, log = await servers.run_to_exit(data, "--fsync", "always")
    assert rc != 0, log
    assert str(first) in log, log
    offsets = [off for off, _size, _rec in record_offsets(last)]
    assert offsets  # the newer segment is intact
    assert "at offset" in log, log


async def test_torn_tail_is_truncated_with_a_warning_and_the_server_starts(
    tmp_path: Path, servers: Servers
) -> None:
    data = tmp_path / "data"
    await fill_and_stop(servers, data, 12)
    (seg,) = segments(data)
    good_size = seg.stat().st_size
    half = encode_record(
        Publish(999, "q", "torn", 1, 0, 1, 0, {}, b'{"torn": true}' * 20), int(time.time() * 1000)
    )
    with seg.open("ab") as fh:
        fh.write(half[: len(half) // 2])

    srv = await servers.start(data, "--fsync", "always")
    c = await RawClient.connected(srv.port)
    info = info_of(await c.queue_info("q"))
    assert info["messageCount"] == 12
    assert_ok(await c.subscribe("q", prefetch=100), T.SUBSCRIBE_ACK)
    got = await c.deliveries(12, "q")
    assert [d.id for d in got] == [f"m{i}" for i in range(12)]
    await c.expect_nothing(lambda m: m.type is T.DELIVER, 0.3)
    await c.close()
    assert await srv.stop() == 0
    warnings = [e for e in log_events(srv.log) if e.get("event") == "truncating torn journal tail"]
    assert len(warnings) == 1, srv.log
    assert warnings[0]["level"] == "warning"
    assert warnings[0]["file"] == str(seg)
    assert warnings[0]["offset"] == good_size
    assert warnings[0]["dropped_bytes"] == len(half) // 2
    assert seg.stat().st_size == good_size
