"""DurableTable (vibemq_server/core/table.py) with a real QueueManager and Journal: entries
survive recovery with their last value, deletions stay deleted, and the journal's reclamation
and compaction treat entries like live messages (never dropping them)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from waits import durable, maintained, wait_for

from vibemq_server.config import QueueDefaults
from vibemq_server.core import ManualClock, QueueManager, StoredMessage, Subscription
from vibemq_server.core.queue import Consumer as CoreConsumer
from vibemq_server.core.table import DurableTable
from vibemq_server.journal.journal import Journal
from vibemq_server.journal.recovery import list_segments

pytestmark = pytest.mark.timeout(60)

TABLE = "$test.table"
PAYLOAD = b'{"data":"' + b"x" * 80 + b'"}'


class Consumer(CoreConsumer):
    writable = True  # (shadows Consumer's read-only property: instances may set it)

    def __init__(self) -> None:
        self.writable = True
        self.got: list[StoredMessage] = []

    def deliver(self, sub: Subscription, msg: StoredMessage) -> None:
        self.got.append(msg)

    def subscription_cancelled(self, sub: Subscription, reason: str) -> None:
        pass


class Env:
    """Managers-without-sockets on one journal directory: open, restart, close."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.clock = ManualClock()
        self.open_journals: list[Journal] = []

    def open(self, **kw: Any) -> tuple[QueueManager, Journal]:
        mgr = QueueManager(QueueDefaults(), self.clock)
        journal = Journal(self.directory, clock=self.clock, **kw)
        self.open_journals.append(journal)
        journal.recover(mgr)
        journal.start(mgr)
        mgr.persistence = journal
        return mgr, journal

    async def restart(self, journal: Journal, **kw: Any) -> tuple[QueueManager, Journal]:
        await journal.close()
        self.open_journals.remove(journal)
        return self.open(**kw)

    def segments(self) -> list[tuple[int, Path]]:
        return list_segments(self.directory)


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    e = Env(tmp_path / "journal")
    yield e
    for journal in list(e.open_journals):
        await journal.close()


def live(journal: Journal) -> int:
    """Unsettled publishes over all segments: what reclamation goes by."""
    return sum(seg.live for seg in journal.segments.values())


def contents(table: DurableTable) -> dict[str, tuple[bytes, dict[str, str]]]:
    return {key: (msg.payload, dict(msg.headers)) for key, msg in table.items()}


# -- the map itself --------------------------------------------------------------------------


async def test_put_get_replace_delete_in_memory(env: Env) -> None:
    mgr, journal = env.open()
    table = DurableTable(mgr, TABLE)
    assert len(table) == 0 and table.get("a") is None and "a" not in table
    first = table.put("a", b"1", {"h": "x"})
    assert table.get("a") is first and "a" in table and len(table) == 1
    second = table.put("a", b"2", {})
    assert table.get("a") is second and len(table) == 1
    assert second.seq > first.seq
    assert table.delete("a") is True
    assert table.delete("a") is False
    assert table.delete("never") is False
    assert len(table) == 0
    assert live(journal) == 0  # every replaced or deleted entry is settled
    # items() is a snapshot: changing the table while iterating is fine.
    for key in "xyz":
        table.put(key, b"v", {})
    for key, _msg in table.items():
        table.delete(key)
    assert len(table) == 0


async def test_entries_are_never_delivered(env: Env) -> None:
    mgr, _journal = env.open()
    table = DurableTable(mgr, TABLE)
    table.put("k", b"v", {})
    consumer = Consumer()
    mgr.subscribe(TABLE, "s", consumer, 10)
    assert consumer.got == []
    assert mgr.queues[TABLE].message_count == 0


async def test_put_replace_delete_survive_recovery(env: Env) -> None:
    mgr, journal = env.open()
    table = DurableTable(mgr, TABLE)
    table.put("a", b"1", {"h": "x"})
    table.put("b", b"2", {})
    table.put("c", b"3", {})
    table.put("b", b"22", {"v": "2"})
    assert table.delete("c")
    assert await durable(journal) is None
    assert live(journal) == 2

    mgr2, journal2 = await env.restart(journal)
    table2 = DurableTable(mgr2, TABLE)
    assert contents(table2) == {"a": (b"1", {"h": "x"}), "b": (b"22", {"v": "2"})}
    assert "c" not in table2
    # Entries are parked, not queued: no memory accounted, nothing to deliver.
    assert mgr2.queues[TABLE].message_count == 0
    assert mgr2.memory_bytes == 0
    assert live(journal2) == 2

    # Changing recovered entries settles them, and a new key gets a fresh seq.
    old_a = table2.get("a")
    assert old_a is not None
    new_a = table2.put("a", b"111", {})
    assert new_a.seq > old_a.seq
    assert table2.delete("b")
    table2.put("d", b"4", {})
    assert await durable(journal2) is None
    assert live(journal2) == 2

    mgr3, _journal3 = await env.restart(journal2)
    table3 = DurableTable(mgr3, TABLE)
    assert contents(table3) == {"a": (b"111", {}), "d": (b"4", {})}


async def test_many_replacements_recover_the_last_value(env: Env) -> None:
    mgr, journal = env.open()
    table = DurableTable(mgr, TABLE)
    for i in range(100):
        table.put("hot", f"v{i}".encode(), {"i": str(i)})
        table.put(f"k{i % 7}", f"w{i}".encode(), {})
    assert await durable(journal) is None
    assert live(journal) == 8
    mgr2, _ = await env.restart(journal)
    table2 = DurableTable(mgr2, TABLE)
    assert contents(table2)["hot"] == (b"v99", {"i": "99"})
    assert {k: v[0] for k, v in contents(table2).items() if k != "hot"} == {
        f"k{j}": f"w{max(i for i in range(100) if i % 7 == j)}".encode() for j in range(7)
    }


async def test_two_tables_are_independent(env: Env) -> None:
    mgr, journal = env.open()
    one = DurableTable(mgr, "$one")
    two = DurableTable(mgr, "$two")
    one.put("k", b"1", {})
    two.put("k", b"2", {})
    one.delete("k")
    assert await durable(journal) is None
    mgr2, _ = await env.restart(journal)
    assert contents(DurableTable(mgr2, "$one")) == {}
    assert contents(DurableTable(mgr2, "$two")) == {"k": (b"2", {})}


async def test_non_durable_table_is_not_recovered(env: Env) -> None:
    mgr, journal = env.open()
    table = DurableTable(mgr, "$volatile", durable=False)
    table.put("k", b"v", {})
    assert table.get("k") is not None
    assert live(journal) == 0
    assert await durable(journal) is None
    mgr2, _ = await env.restart(journal)
    assert "$volatile" not in mgr2.queues
    assert len(DurableTable(mgr2, "$volatile", durable=False)) == 0


async def test_table_without_persistence_works_in_memory() -> None:
    mgr = QueueManager(QueueDefaults(), ManualClock())
    table = DurableTable(mgr, TABLE)
    table.put("a", b"1", {})
    table.put("a", b"2", {})
    assert contents(table) == {"a": (b"2", {})}
    assert table.delete("a") and len(table) == 0


# -- reclamation and compaction --------------------------------------------------------------


async def _churn(mgr: QueueManager, journal: Journal, table: DurableTable, rounds: int) -> None:
    """Roll segments: a work queue's messages published and acked, and a hot table key
    rewritten; afterwards every record from the churn is settled."""
    if "work" not in mgr.queues:
        mgr.create_queue("work", mgr.options_from({}))
    consumer = Consumer()
    sub = mgr.subscribe("work", f"w{rounds}", consumer, 10_000)
    for r in range(rounds):
        for i in range(10):
            mgr.publish("work", f"m{rounds}-{r}-{i}", PAYLOAD, {})
            table.put("hot", PAYLOAD, {"round": str(r)})
        assert await durable(journal) is None
        for mid in list(sub.inflight):
            assert mgr.ack(sub, mid)
        assert await durable(journal) is None
    mgr.unsubscribe(sub)


async def test_reclaim_and_compaction_keep_live_entries(env: Env) -> None:
    mgr, journal = env.open(segment_size=4096)
    table = DurableTable(mgr, TABLE)
    for i in range(5):
        table.put(f"k{i}", PAYLOAD, {"i": str(i)})
    table.put("gone", PAYLOAD, {})
    assert await durable(journal) is None
    oldest = env.segments()[0][1]

    await _churn(mgr, journal, table, 30)
    table.delete("gone")
    assert await durable(journal) is None
    assert len(env.segments()) >= 5
    assert live(journal) == len(table) == 6  # k0..k4 and the last "hot"

    for _ in range(20):
        await maintained(journal)
        assert await durable(journal) is None
    # The oldest segment held the long-lived entries: compacted (copied forward), deleted.
    await wait_for(lambda: not oldest.exists())
    assert len(env.segments()) <= 3
    assert live(journal) == len(table) == 6

    mgr2, journal2 = await env.restart(journal, segment_size=4096)
    table2 = DurableTable(mgr2, TABLE)
    expected = {f"k{i}": (PAYLOAD, {"i": str(i)}) for i in range(5)}
    expected["hot"] = (PAYLOAD, {"round": "29"})
    assert contents(table2) == expected
    assert mgr2.queues["work"].message_count == 0
    assert live(journal2) == 6

    # After recovery the compacted copies are ordinary entries: churn again, reclaim again.
    await _churn(mgr2, journal2, table2, 30)
    for _ in range(20):
        await maintained(journal2)
        assert await durable(journal2) is None
    assert len(env.segments()) <= 3
    expected["hot"] = (PAYLOAD, {"round": "29"})
    assert contents(table2) == expected
    mgr3, _ = await env.restart(journal2, segment_size=4096)
    assert contents(DurableTable(mgr3, TABLE)) == expected


async def test_deleted_entries_release_their_segments(env: Env) -> None:
    mgr, journal = env.open(segment_size=4096)
    table = DurableTable(mgr, TABLE)
    for i in range(100):
        table.put(f"k{i}", PAYLOAD, {})
        if i % 10 == 9:
            assert await durable(journal) is None
    assert len(env.segments()) >= 3
    for i in range(100):
        table.delete(f"k{i}")
    assert live(journal) == 0
    table.put("last", b"1", {})
    assert await durable(journal) is None
    for _ in range(10):
        await maintained(journal)
        assert await durable(journal) is None
    assert len(env.segments()) <= 2
    mgr2, _ = await env.restart(journal, segment_size=4096)
    assert contents(DurableTable(mgr2, TABLE)) == {"last": (b"1", {})}


# -- entries with a deadline (MQTT 5 retained messages with a Message Expiry Interval) -------


async def test_expiring_entries_keep_their_deadline_across_a_restart(env: Env) -> None:
    mgr, journal = env.open()
    table = DurableTable(mgr, TABLE)
    now = env.clock()
    table.put("soon", b"1", {}, now + 1_000)
    table.put("later", b"2", {}, now + 60_000)
    table.put("never", b"3", {})
    assert table.drop_expired() == now + 1_000  # nothing due yet: the next deadline
    assert await durable(journal) is None
    mgr, journal = await env.restart(journal)
    table = DurableTable(mgr, TABLE)
    assert {k: m.expires_at for k, m in table.items()} == {
        "soon": now + 1_000,
        "later": now + 60_000,
        "never": 0,
    }
    env.clock.advance(1_000)  # (the deadline itself counts as passed)
    assert table.drop_expired() == now + 60_000
    assert sorted(k for k, _ in table.items()) == ["later", "never"]
    env.clock.advance(59_000)
    assert table.drop_expired() == 0  # none left that expires
    assert [k for k, _ in table.items()] == ["never"]
    assert await durable(journal) is None
    mgr, journal = await env.restart(journal)
    assert [k for k, _ in DurableTable(mgr, TABLE).items()] == ["never"]  # deletions kept
