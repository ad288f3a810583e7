"""A full or read-only disk under a real ``vibemq-server`` process.

The data dir is a small tmpfs mounted by the test (it runs as root; a failing mount fails the
test, it is never skipped). A filler file created in the tmpfs beforehand is deleted to give
the broker room again. Servers are killed before the tmpfs is unmounted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rawclient import RawClient, assert_error, assert_ok
from serverproc import ServerProc, Servers
from test_durability import info_of, log_events, publish_all

from vibemq_server.protocol import CommandType, Message

T = CommandType
BIG = json.dumps("x" * 65536).encode()  # a 64 KiB JSON string


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)


@contextlib.contextmanager
def tmpfs(path: Path, size: str, *, read_only: bool = False) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` on ``path``; unmounted on the way out."""
    path.mkdir(parents=True, exist_ok=True)
    opts = f"size={size},mode=0755" + (",ro" if read_only else "")
    done = _run("mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path))
    if done.returncode != 0:
        pytest.fail(
            f"cannot mount a tmpfs on {path} (these tests need root and mount(8)): "
            f"{done.stderr.strip() or done.stdout.strip()}"
        )
    try:
        yield path
    finally:
        if _run("umount", str(path)).returncode != 0:
            _run("umount", "-l", str(path))


def remount(path: Path, mode: str) -> None:
    done = _run("mount", "-o", f"remount,{mode}", str(path))
    assert done.returncode == 0, f"remount {mode} failed: {done.stderr}"


async def publish_until_refused(c: RawClient, queue: str, limit: int) -> tuple[list[str], Message]:
    """Publish 64 KiB messages one at a time until one is refused; the stored ids and the Error."""
    stored: list[str] = []
    for i in range(limit):
        mid = f"big{i}"
        reply = await c.publish(queue, BIG, msg_id=mid)
        if reply.type is T.PUBLISH_ACK:
            stored.append(mid)
            continue
        return stored, reply
    raise AssertionError(f"{limit} x 64 KiB publishes all acknowledged on a small tmpfs")


async def publish_when_writable(c: RawClient, queue: str, timeout: float = 10.0) -> str:
    """Retry one small publish until a PublishAck (the broker retries its writes every tick)."""
    deadline = time.monotonic() + timeout
    n = 0
    while True:
        n += 1
        mid = f"again{n}"
        reply = await c.publish(queue, {"n": n}, msg_id=mid)
        if reply.type is T.PUBLISH_ACK:
            return mid
        assert_error(reply, "SERVER_ERROR", mid)
        assert time.monotonic() < deadline, "publishes never succeeded again after freeing space"
        await asyncio.sleep(0.1)


async def drain_ids(c: RawClient, queue: str, quiet: float = 0.5, limit: float = 10.0) -> list[str]:
    """Ids of every delivery from ``queue`` until nothing arrives for ``quiet`` seconds."""
    ids: list[str] = []
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            d = await c.delivery(queue, timeout=quiet)
        except TimeoutError:
            return ids
        ids.append(d.id)
    raise AssertionError(f"deliveries never stopped: {len(ids)} so far")


async def fill_disk(
    servers: Servers, data: Path
) -> tuple[ServerProc, RawClient, list[str], set[str]]:
    """Start a server on ``data`` and publish 64 KiB messages until the journal cannot write.

    Returns the server, the publisher, the stored (PublishAck'd) ids and the refused ids.
    """
    srv = await servers.start(data, "--fsync", "always")
    pub = await RawClient.connected(srv.port)
    assert_ok(await pub.create_queue("big", options={"maxQueueSize": 1000}), T.CREATE_QUEUE)
    stored, refused = await publish_until_refused(pub, "big", 100)
    assert len(stored) >= 5, stored  # some room was there
    assert_error(refused, "SERVER_ERROR", refused.id)
    assert "not stored" in refused.error_message
    refused_ids = {refused.id}
    # While the disk is full, every durable publish that does not fit is refused, none
    # acknowledged. (Same size as the refused one: a smaller message may fit in the space the
    # cut-back write left, once the broker's retry tick has found the journal writable.)
    for i in range(3):
        mid = f"while_full{i}"
        assert_error(await pub.publish("big", BIG, msg_id=mid), "SERVER_ERROR", mid)
        refused_ids.add(mid)
    assert srv.alive, srv.log
    return srv, pub, stored, refused_ids


async def test_disk_full_refuses_publishes_keeps_serving_and_recovers(
    tmp_path: Path, servers: Servers
) -> None:
    with tmpfs(tmp_path / "disk", "3m") as disk:
        try:
            filler = disk / "filler"
            filler.write_bytes(b"\0" * (1024 * 1024))
            data = disk / "data"
            srv, pub, stored, refused_ids = await fill_disk(servers, data)

            # The broker keeps serving: ping, queue info, consumers get and ack stored messages.
            assert_ok(await pub.ping(), T.PONG)
            cons = await RawClient.connected(srv.port)
            assert_ok(await cons.ping(), T.PONG)
            assert_ok(await cons.subscribe("big", prefetch=1000), T.SUBSCRIBE_ACK)
            # (Whether a refused publish may be delivered is checked by the next test.)
            got = [i for i in await drain_ids(cons, "big") if i not in refused_ids]
            assert got == stored
            acked = stored[: len(stored) // 2]
            for mid in acked:
                cons.ack(mid)
            assert_ok(await cons.ping(), T.PONG)
            info = info_of(await pub.queue_info("big"))
            assert info["stats"]["acked"] == len(acked)  # type: ignore[index]
            errors = [e for e in log_events(srv.log) if e.get("level") == "error"]
            assert any("journal write failed" in str(e.get("event")) for e in errors), srv.log

            # Free space: publishes are accepted (and durable) again.
            filler.unlink()
            again = [await publish_when_writable(pub, "big")]
            more = [f"after{i}" for i in range(3)]
            await publish_all(pub, "big", more, payload={"after": True})
            again += more
            fresh = await cons.deliveries(len(again), "big", timeout=10)
            assert [d.id for d in fresh] == again
            for d in fresh:
                cons.ack(d.id)
            assert_ok(await cons.ping(), T.PONG)
            await pub.close()
            await cons.close()
            assert await srv.stop() == 0, srv.log
            assert any(e.get("event") == "journal writable again" for e in log_events(srv.log))

            # After a restart: the acks made during the outage were written once space was
            # back, so only the stored-but-unacked messages return.
            srv = await servers.start(data, "--fsync", "always")
            c = await RawClient.connected(srv.port)
            assert_ok(await c.subscribe("big", prefetch=1000), T.SUBSCRIBE_ACK)
            back = [i for i in await drain_ids(c, "big") if i not in refused_ids]
            assert back == stored[len(acked) :]
            await c.close()
            assert await srv.stop() == 0, srv.log
        finally:
            await servers.cleanup()


async def test_a_publish_refused_for_a_full_disk_is_never_delivered(
    tmp_path: Path, servers: Servers
) -> None:
    """Error SERVER_ERROR says "message not stored": a client will publish it again, so the
    broker must not also deliver the refused copy (now, or after space is back, or after a
    restart), or the message arrives twice."""
    with tmpfs(tmp_path / "disk", "2m") as disk:
        try:
            filler = disk / "filler"
            filler.write_bytes(b"\0" * (512 * 1024))
            data = disk / "data"
            srv, pub, stored, refused_ids = await fill_disk(servers, data)
            cons = await RawClient.connected(srv.port)
            assert_ok(await cons.subscribe("big", prefetch=1000), T.SUBSCRIBE_ACK)
            seen = await drain_ids(cons, "big")
            filler.unlink()
            await publish_when_writable(pub, "big")
            seen += await drain_ids(cons, "big")
            await pub.close()
            await cons.close()
            assert await srv.stop() == 0, srv.log
            srv = await servers.start(data, "--fsync", "always")
            c = await RawClient.connected(srv.port)
            assert_ok(await c.subscribe("big", prefetch=1000), T.SUBSCRIBE_ACK)
            seen += await drain_ids(c, "big")
            await c.close()
            assert await srv.stop() == 0, srv.log
        finally:
            await servers.cleanup()
    assert set(stored) <= set(seen)
    delivered_refused = sorted(refused_ids & set(seen))
    assert not delivered_refused, (
        f"publishes refused with SERVER_ERROR ('message not stored') were delivered: "
        f"{delivered_refused}"
    )


async def test_read_only_empty_data_dir_exits_non_zero(tmp_path: Path, servers: Servers) -> None:
    with tmpfs(tmp_path / "ro", "1m", read_only=True) as ro:
        try:
            rc, log = await servers.run_to_exit(ro, "--fsync", "always")
        finally:
            await servers.cleanup()
    assert rc != 0, log
    assert "Read-only file system" in log, log
    assert str(ro / "journal") in log, log
    errors = [e for e in log_events(log) if e.get("level") == "error"]
    assert [e.get("event") for e in errors] == ["cannot start"], log


async def test_journal_remounted_read_only_exits_non_zero_and_keeps_data(
    tmp_path: Path, servers: Servers
) -> None:
    with tmpfs(tmp_path / "disk", "2m") as disk:
        try:
            data = disk / "data"
            srv = await servers.start(data, "--fsync", "always")
            c = await RawClient.connected(srv.port)
            await publish_all(c, "keep", ["k1", "k2"])
            await c.close()
            assert await srv.stop() == 0, srv.log
            before = sorted(p.name for p in (data / "journal").iterdir())

            remount(disk, "ro")
            rc, log = await servers.run_to_exit(data, "--fsync", "always")
            assert rc != 0, log
            assert "Read-only file system" in log, log
            assert str(data / "journal") in log, log

            remount(disk, "rw")
            assert sorted(p.name for p in (data / "journal").iterdir()) == before
            srv = await servers.start(data, "--fsync", "always")
            c = await RawClient.connected(srv.port)
            assert_ok(await c.subscribe("keep"), T.SUBSCRIBE_ACK)
            assert [d.id for d in await c.deliveries(2, "keep")] == ["k1", "k2"]
            await c.close()
            assert await srv.stop() == 0, srv.log
        finally:
            await servers.cleanup()


async def test_data_dir_below_a_regular_file_exits_non_zero(
    tmp_path: Path, servers: Servers
) -> None:
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file")
    data = blocker / "data"
    rc, log = await servers.run_to_exit(data)
    assert rc != 0, log
    assert "cannot use data dir" in log, log
    assert str(data) in log, log
    assert "Not a directory" in log, log
