"""Broker-independent parts of the load generator.

A *driver* knows one wire protocol (VibeMQ, MQTT 3.1.1, AMQP 0-9-1): how to open a publisher or
a subscriber connection with plain blocking sockets, how to pre-encode a batch of publishes, and
how to scan the bytes coming back cheaply (count publisher acks; count deliveries and produce
the ack bytes for them). This module runs the drivers:

* throughput: the subscriber and the publisher each run in their own process (``spawn``), each
  with its own uvloop event loop and a bare ``asyncio.Protocol`` over the already handshaken
  socket. The publisher writes pre-encoded batches while at most ``window`` publishes are
  unacknowledged; the subscriber acknowledges every delivery, one write per read.
* latency: one process, blocking sockets, strictly sequential publish -> deliver -> ack.

Over TLS (``tls_ca`` given), a connection runs the client side of TLS itself over memory BIOs
(``TlsClient``): the blocking handshake and the adopted asyncio socket share one TLS session.

Timestamps that cross processes use ``time.monotonic_ns`` (CLOCK_MONOTONIC, system wide).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import resource
import signal
import socket
import ssl
import statistics
import subprocess
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

T = TypeVar("T")

PAYLOAD_SIZE = 64


class BenchError(RuntimeError):
    """The broker answered with an error or broke the protocol; the run cannot go on."""


# --------------------------------------------------------------------------------------------
# small utilities


def raise_nofile_limit() -> int:
    """Raise RLIMIT_NOFILE soft to hard (children such as the broker inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1_048_576)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def install_sigterm_exit() -> None:
    """Turn SIGTERM into SystemExit so ``finally`` blocks stop the brokers we started."""

    def _exit(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_port(host: str, port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return True
        except OSError:
            time.sleep(0.1)
    return False


def make_payload(seq: int, size: int = PAYLOAD_SIZE) -> bytes:
    """A JSON object of exactly ``size`` bytes (at least 26) carrying a sequence number."""
    head = b'{"seq":"%010d","pad":"' % seq
    pad = size - len(head) - 2
    if pad < 0:
        raise ValueError(f"payload size {size} is too small")
    return head + b"x" * pad + b'"}'


def rss_kib(pid: int) -> int | None:
    """VmRSS of a process in KiB, or None when it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def group_pids(pgid: int) -> list[int]:
    """Every live process whose process group is ``pgid``."""
    pids: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[2]) == pgid:  # fields: state ppid pgrp ...
            pids.append(int(entry))
    return pids


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time consumed so far by the given processes."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        total += int(fields[11]) + int(fields[12])  # utime stime
    return total / ticks


def percentiles_us(samples_ns: list[int]) -> dict[str, float]:
    ordered = sorted(samples_ns)
    if not ordered:
        return {}

    def pick(q: float) -> float:
        idx = min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))
        return ordered[idx] / 1000.0

    return {
        "p50_us": pick(0.50),
        "p95_us": pick(0.95),
        "p99_us": pick(0.99),
        "mean_us": statistics.fmean(ordered) / 1000.0,
        "min_us": ordered[0] / 1000.0,
        "max_us": ordered[-1] / 1000.0,
    }


def median_of(values: Iterable[float | None]) -> float | None:
    """The median of the values known (None where none is)."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def cpu_us_per_message(runs: Iterable[tuple[float | None, int]]) -> float | None:
    """The broker's CPU a message (µs) over several runs of ``(broker CPU s, messages)``: their
    CPU summed over their messages summed (runs whose CPU is unknown left out). Not the median
    of each run's own figure: work done once in a while -- a durable journal's segment sealed,
    indexed and deleted every 64 MiB -- falls in a few runs only, and a median keeps it whole
    or drops it depending on how many runs it fell in (bench.build_ab's 100,000-message
    durable runs rotated in 1 of 3, paths_bench's 200,000-message ones in most)."""
    known = [(cpu, n) for cpu, n in runs if cpu is not None]
    count = sum(n for _, n in known)
    return sum(cpu for cpu, _ in known) / count * 1e6 if count else None


def parse_target(value: str, default_host: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``:PORT``, on ``default_host``) as a pair."""
    host, _, port = value.rpartition(":")
    return host or default_host, int(port)


def leading_bytes(column: bytes | bytearray, value: bytes | bytearray) -> int:
    """How many bytes at the start of ``column`` equal the single byte ``value``."""
    return len(column) - len(column.lstrip(value))


def same_heads(buf: bytes | bytearray, pos: int, size: int, count: int, width: int) -> int:
    """How many of the ``count`` frames of ``size`` bytes from ``pos`` start with the first
    one's ``width`` bytes. Every frame's head is compared, a column of heads at a time (one
    strided slice per byte), at C speed; ``count`` >= 1 (the first matches itself)."""
    stop = pos + count * size
    for i in range(width):
        count = min(count, leading_bytes(buf[pos + i : stop : size], buf[pos + i : pos + i + 1]))
    return count


def format_num(v: float | None, unit: str = "") -> str:
    """A table cell: ``-`` for no figure, a percentage or CPU share, or a count."""
    if v is None:
        return "-"
    if unit == "%":
        return f"{v:.2f}%"
    if unit == "cpu":
        return f"{v:.0f}%"
    return f"{v:,.0f}"


def result_failed(result: dict[str, Any]) -> bool:
    """The broker could not be measured, or some phase of some run reported an error."""
    if "error" in result:
        return True
    return any(phase["errors"] for run in result["runs"] for k, phase in run.items() if k != "run")


def run_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on uvloop when it is installed, else on the default loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


# --------------------------------------------------------------------------------------------
# blocking connection used for handshakes and the latency phase


def make_tls_cert(directory: Path) -> tuple[Path, Path]:
    """A self-signed server certificate for 127.0.0.1/localhost (the clients' CA too), made
    with the openssl command: (certificate, key), both PEM."""
    cert, key = directory / "tls-cert.pem", directory / "tls-key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "ec", "-nodes", "-days", "2"),
            *("-pkeyopt", "ec_paramgen_curve:prime256v1", "-subj", "/CN=localhost"),
            *("-keyout", str(key), "-out", str(cert)),
            *("-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    # Read by brokers that drop privileges (mosquitto as its own user); a bench-only key.
    os.chmod(cert, 0o644)
    os.chmod(key, 0o644)
    return cert, key


class TlsClient:
    """The client side of one TLS session over memory BIOs: ``encrypt`` what goes out,
    ``decrypt`` what comes in (every complete record)."""

    def __init__(self, ca_file: str) -> None:
        ctx = ssl.create_default_context(cafile=ca_file)
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.obj = ctx.wrap_bio(self.incoming, self.outgoing, server_hostname="localhost")

    def handshake(self, sock: socket.socket) -> None:
        while True:
            try:
                self.obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                if self.outgoing.pending:
                    sock.sendall(self.outgoing.read())
                data = sock.recv(65536)
                if not data:
                    raise BenchError("connection closed during the TLS handshake") from None
                self.incoming.write(data)
        if self.outgoing.pending:
            sock.sendall(self.outgoing.read())

    def encrypt(self, data: bytes) -> bytes:
        self.obj.write(data)
        return self.outgoing.read()

    def decrypt(self, data: bytes) -> bytes:
        if data:
            self.incoming.write(data)
        out: list[bytes] = []
        try:
            while True:
                chunk = self.obj.read(32_768)
                if not chunk:
                    break
                out.append(chunk)
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLZeroReturnError:
            pass
        return b"".join(out)


class BlockingConn:
    """A connected blocking socket plus a receive buffer; over TLS when ``tls_ca`` names the
    CA file to verify the server with."""

    def __init__(
        self, host: str, port: int, timeout: float = 10.0, tls_ca: str | None = None
    ) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.tls: TlsClient | None = None
        if tls_ca:
            self.tls = TlsClient(tls_ca)
            self.tls.handshake(self.sock)

    def send(self, data: bytes | memoryview) -> None:
        if self.tls is not None:
            self.sock.sendall(self.tls.encrypt(bytes(data)))
        else:
            self.sock.sendall(data)

    def recv(self, size: int = 262_144) -> bytes:
        """What arrives next (b"" at EOF); over TLS, at least one whole record's worth."""
        if self.tls is None:
            return self.sock.recv(size)
        while True:
            raw = self.sock.recv(size)
            if not raw:
                return b""
            plain = self.tls.decrypt(raw)
            if plain:
                return plain

    def fill(self) -> None:
        """Read at least one more byte into the buffer (raises on EOF)."""
        chunk = self.recv(262_144)
        if not chunk:
            raise BenchError("connection closed by the broker")
        self.buf += chunk

    def read_exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            self.fill()
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


# --------------------------------------------------------------------------------------------
# driver interface


class AckCounter(Protocol):
    def feed(self, buf: bytearray) -> tuple[int, int]:
        """Scan complete frames at the start of ``buf``: (bytes consumed, publishes acked)."""
        ...


#: what the scanners read: a subscriber's ``ReadArea``, a blocking connection's buffer
Buffer = bytes | bytearray


class DeliveryScanner(Protocol):
    def feed(self, buf: Buffer, end: int = -1) -> tuple[int, int, bytes]:
        """Scan the frames in ``buf`` up to ``end`` (-1: all of it): (bytes consumed,
        messages delivered, ack bytes to send). A scanner may consume a delivery whose head
        has come but not all its body (``BodySkip``)."""
        ...


class BodySkip:
    """The rest of a delivery whose head a scanner has read, skipped by its length and
    never copied (a 1 MiB payload is nothing the load generator reads): the delivery is
    counted, and its ack sent, when its last byte has come, as if it had waited for all."""

    __slots__ = ("ack", "count", "left")

    def __init__(self) -> None:
        self.left = 0  # bytes of the delivery still to come
        self.ack = b""
        self.count = 0

    def begin(self, left: int, ack: bytes, count: int = 1) -> None:
        self.left, self.ack, self.count = left, ack, count

    def resume(self, end: int, acks: bytearray) -> tuple[int, int]:
        """(bytes of a read of ``end`` bytes that are the delivery's, deliveries completed);
        its ack appended to ``acks`` when it completes."""
        left = self.left
        if left > end:
            self.left = left - end
            return end, 0
        self.left = 0
        acks += self.ack
        return left, self.count


class ReadArea:
    """Where a subscriber's socket reads land and are scanned in place (the reads of a
    ``BufferedProtocol``: no copy of every read into a ``bytes``, as uvloop makes for
    ``data_received``, nor into a growing ``bytearray``). What the scanner leaves of a read
    (a frame whose head has not all come: a delivery's body it skips, ``BodySkip``) is moved
    to the front and the next read lands after it. Every protocol's subscriber reads the
    same way, ``SIZE`` bytes at most a read (the broker's read size)."""

    SIZE = 256_000

    def __init__(self) -> None:
        self.area = bytearray(self.SIZE)
        self.held = 0  # bytes at the front left from the reads before

    def target(self) -> memoryview:
        """The room the next read may fill (``get_buffer``)."""
        return memoryview(self.area)[self.held :]

    def scan(self, nbytes: int, scanner: DeliveryScanner) -> tuple[int, bytes]:
        """A read of ``nbytes`` into ``target()`` through ``scanner``: (messages delivered,
        ack bytes to send). The scanner reads the area itself up to the read's end (a
        ``bytearray`` is read faster than a view of it)."""
        area = self.area
        end = self.held + nbytes
        consumed, delivered, reply = scanner.feed(area, end)
        left = end - consumed
        if left * 2 > len(area):  # (a scanner that waits for whole big frames)
            self.area = area[consumed:end] + bytearray(len(area))
        elif left:
            area[:left] = area[consumed:end]  # (the same size: allowed while uvloop reads)
        self.held = left
        return delivered, reply

    def feed(self, data: bytes, scanner: DeliveryScanner) -> tuple[int, bytes]:
        """Bytes that came otherwise (decrypted, or read before), as reads into the area."""
        delivered, replies = 0, []
        step = self.SIZE // 2  # (scan leaves at least that much room)
        for at in range(0, len(data), step):
            part = data[at : at + step]
            self.target()[: len(part)] = part
            n, reply = self.scan(len(part), scanner)
            delivered += n
            replies.append(reply)
        return delivered, b"".join(replies)


class Driver(Protocol):
    """One wire protocol. Instances must be picklable (they cross into worker processes)."""

    name: str

    def connect_publisher(self) -> BlockingConn: ...

    def connect_subscriber(self) -> BlockingConn: ...

    def publish_batch(self, start: int, count: int) -> bytes:
        """Pre-encoded publishes for messages ``start`` .. ``start + count - 1``."""
        ...

    def ack_counter(self) -> AckCounter: ...

    def delivery_scanner(self) -> DeliveryScanner: ...

    def goodbye(self, conn: BlockingConn) -> None:
        """Say goodbye politely (best effort) and close."""
        ...


# --------------------------------------------------------------------------------------------
# async hot loops


@dataclass
class PubStats:
    acked: int = 0
    t_start_ns: int = 0
    t_end_ns: int = 0
    cpu_s: float = 0.0
    #: cpu_s split into user and kernel time (os.times, to the clock tick)
    user_s: float = 0.0
    sys_s: float = 0.0
    error: str = ""


@dataclass
class SubStats:
    delivered: int = 0
    t_first_ns: int = 0
    t_end_ns: int = 0
    cpu_s: float = 0.0
    user_s: float = 0.0
    sys_s: float = 0.0
    error: str = ""


def _cpu_since(cpu0: float, times0: os.times_result, stats: PubStats | SubStats) -> None:
    """The process's CPU since ``cpu0`` / ``times0`` into ``stats`` (all, user, kernel)."""
    stats.cpu_s = time.process_time() - cpu0
    now = os.times()
    stats.user_s = now.user - times0.user
    stats.sys_s = now.system - times0.system


class _PubProtocol(asyncio.Protocol):
    def __init__(
        self,
        batches: list[bytes],
        sizes: list[int],
        window: int,
        counter: AckCounter,
        leftover: bytes,
        done: asyncio.Future[None],
        gated: bool = False,
    ) -> None:
        self.gated = gated
        self.batches = batches
        self.sizes = sizes
        self.window = window
        self.counter = counter
        self.buf = bytearray(leftover)
        self.done = done
        self.total = sum(sizes)
        self.next = 0
        self.sent = 0
        self.stats = PubStats()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        if not self.gated:
            self.start()

    def start(self) -> None:
        self.stats.t_start_ns = time.monotonic_ns()
        self.pump()

    def pump(self) -> None:
        out: list[bytes] = []
        room = self.window - (self.sent - self.stats.acked)
        batches, sizes = self.batches, self.sizes
        while self.next < len(batches) and sizes[self.next] <= room:
            out.append(batches[self.next])
            room -= sizes[self.next]
            self.sent += sizes[self.next]
            self.next += 1
        if out and self.transport is not None:
            self.transport.writelines(out)

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        try:
            consumed, acked = self.counter.feed(buf)
        except BenchError as exc:
            self.finish(str(exc))
            return
        if consumed:
            del buf[:consumed]
        if acked:
            self.stats.acked += acked
            if self.stats.acked >= self.total:
                self.finish("")
                return
            self.pump()

    def finish(self, error: str) -> None:
        if not self.done.done():
            self.stats.t_end_ns = time.monotonic_ns()
            self.stats.error = error
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.finish(f"connection lost: {exc!r}")


class _SubProtocol(asyncio.BufferedProtocol):
    """Reads into a ``ReadArea`` and scans them there; ``data_received`` only for bytes
    that came otherwise (decrypted by ``_TlsProtocol``, or read before it took over)."""

    def __init__(
        self,
        expected: int,
        scanner: DeliveryScanner,
        done: asyncio.Future[None],
    ) -> None:
        self.expected = expected
        self.scanner = scanner
        self.reads = ReadArea()
        self.done = done
        self.stats = SubStats()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.reads.target()

    def buffer_updated(self, nbytes: int) -> None:
        try:
            self.counted(*self.reads.scan(nbytes, self.scanner))
        except BenchError as exc:
            self.finish(str(exc))

    def data_received(self, data: bytes) -> None:
        try:
            self.counted(*self.reads.feed(data, self.scanner))
        except BenchError as exc:
            self.finish(str(exc))

    def counted(self, delivered: int, reply: bytes) -> None:
        if reply and self.transport is not None:
            self.transport.write(reply)
        if delivered:
            stats = self.stats
            if not stats.t_first_ns:
                stats.t_first_ns = time.monotonic_ns()
            stats.delivered += delivered
            if stats.delivered >= self.expected:
                self.finish("")

    def finish(self, error: str) -> None:
        if not self.done.done():
            self.stats.t_end_ns = time.monotonic_ns()
            self.stats.error = error
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.finish(f"connection lost: {exc!r}")


class _TlsTransport:
    """What the hot loops write through over TLS: encrypts, then writes to the socket."""

    def __init__(self, raw: asyncio.Transport, tls: TlsClient) -> None:
        self.raw, self.tls = raw, tls

    def write(self, data: bytes) -> None:
        self.raw.write(self.tls.encrypt(data))

    def writelines(self, chunks: list[bytes]) -> None:
        self.write(b"".join(chunks))

    def close(self) -> None:
        self.raw.close()


class _Receiver(Protocol):
    """What the hot loops' protocols have in common (the subscriber's is a
    ``BufferedProtocol`` whose ``data_received`` takes the bytes TLS decrypted)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None: ...

    def data_received(self, data: bytes) -> None: ...

    def connection_lost(self, exc: Exception | None) -> None: ...


class _TlsProtocol(asyncio.Protocol):
    """Decrypts for an inner protocol (the TLS session the blocking handshake started)."""

    def __init__(self, inner: _Receiver, tls: TlsClient) -> None:
        self.inner, self.tls = inner, tls

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        shim = _TlsTransport(cast(asyncio.Transport, transport), self.tls)
        self.inner.connection_made(cast(asyncio.Transport, shim))

    def data_received(self, data: bytes) -> None:
        plain = self.tls.decrypt(data)
        if plain:
            self.inner.data_received(plain)

    def connection_lost(self, exc: Exception | None) -> None:
        self.inner.connection_lost(exc)


async def _adopt(
    conn: BlockingConn, factory: Callable[[], _Receiver]
) -> tuple[asyncio.BaseTransport, object]:
    loop = asyncio.get_running_loop()
    conn.sock.setblocking(False)
    tls = conn.tls
    if tls is not None:
        inner = factory()
        transport, _ = await loop.create_connection(
            lambda: _TlsProtocol(inner, tls), sock=conn.sock
        )
        return transport, inner
    make = cast(Callable[[], asyncio.BaseProtocol], factory)  # (each is one, or Buffered)
    return await loop.create_connection(make, sock=conn.sock)


async def publish_pipelined(
    conn: BlockingConn,
    batches: list[bytes],
    sizes: list[int],
    window: int,
    counter: AckCounter,
    timeout: float,
    gate: asyncio.Future[None] | None = None,
) -> PubStats:
    """Write the batches keeping at most ``window`` publishes unacked; wait for every ack.
    ``gate``: adopt the socket now, write from when it is done (processes that start at once)."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    leftover = bytes(conn.buf)
    conn.buf.clear()
    proto = _PubProtocol(batches, sizes, window, counter, leftover, done, gate is not None)
    cpu0, times0 = time.process_time(), os.times()
    transport, _ = await _adopt(conn, lambda: proto)
    if gate is not None:
        await gate
        cpu0, times0 = time.process_time(), os.times()
        proto.start()
    if proto.buf:
        proto.data_received(b"")
    try:
        await asyncio.wait_for(asyncio.shield(done), timeout)
    except TimeoutError:
        proto.finish(f"timeout after {timeout:.0f}s with {proto.stats.acked} acked")
    _cpu_since(cpu0, times0, proto.stats)
    transport.close()
    return proto.stats


async def consume_counting(
    conn: BlockingConn, expected: int, scanner: DeliveryScanner, timeout: float
) -> SubStats:
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    proto = _SubProtocol(expected, scanner, done)
    leftover = bytes(conn.buf)
    conn.buf.clear()
    cpu0, times0 = time.process_time(), os.times()
    transport, _ = await _adopt(conn, lambda: proto)
    if leftover:
        proto.data_received(leftover)
    try:
        await asyncio.wait_for(asyncio.shield(done), timeout)
    except TimeoutError:
        proto.finish(f"timeout after {timeout:.0f}s with {proto.stats.delivered} delivered")
    _cpu_since(cpu0, times0, proto.stats)
    transport.close()
    return proto.stats


def encode_batches(driver: Driver, total: int, batch: int) -> tuple[list[bytes], list[int]]:
    batches: list[bytes] = []
    sizes: list[int] = []
    for start in range(0, total, batch):
        count = min(batch, total - start)
        batches.append(driver.publish_batch(start, count))
        sizes.append(count)
    return batches, sizes


# --------------------------------------------------------------------------------------------
# worker processes


def _publisher_main(
    driver: Driver, total: int, window: int, batch: int, timeout: float, pipe: Connection
) -> None:
    try:
        batches, sizes = encode_batches(driver, total, batch)
        conn = driver.connect_publisher()
        pipe.send(("ready", None))
        stats = run_loop(
            publish_pipelined(conn, batches, sizes, window, driver.ack_counter(), timeout)
        )
        pipe.send(("done", asdict(stats)))
    except Exception as exc:
        pipe.send(("error", f"publisher: {exc!r}"))


def _subscriber_main(driver: Driver, total: int, timeout: float, pipe: Connection) -> None:
    try:
        conn = driver.connect_subscriber()
        pipe.send(("ready", None))
        stats = run_loop(consume_counting(conn, total, driver.delivery_scanner(), timeout))
        pipe.send(("done", asdict(stats)))
    except Exception as exc:
        pipe.send(("error", f"subscriber: {exc!r}"))


def expect_report(pipe: Connection, what: str, timeout: float) -> Any:
    """The value of a worker's next report, which must be ``what`` (a report ``error``, or
    none within ``timeout`` seconds: BenchError)."""
    if not pipe.poll(timeout):
        raise BenchError(f"no '{what}' from worker within {timeout:.0f}s")
    kind, value = pipe.recv()
    if kind == "error":
        raise BenchError(str(value))
    if kind != what:
        raise BenchError(f"worker said {kind!r}, expected {what!r}")
    return value


@dataclass
class ThroughputResult:
    broker: str
    messages: int
    window: int
    batch: int
    acked: int = 0
    delivered: int = 0
    publish_rate: float = 0.0
    deliver_rate: float = 0.0
    elapsed_s: float = 0.0
    publisher_cpu_s: float = 0.0
    subscriber_cpu_s: float = 0.0
    #: the generators' CPU in user space and in the kernel (os.times, to the clock tick)
    publisher_user_s: float = 0.0
    publisher_sys_s: float = 0.0
    subscriber_user_s: float = 0.0
    subscriber_sys_s: float = 0.0
    broker_cpu_s: float | None = None
    errors: list[str] = field(default_factory=list)


def run_throughput(
    driver: Driver,
    total: int,
    *,
    window: int,
    batch: int,
    timeout: float,
    broker_pids: Callable[[], list[int]] | None = None,
    timed: Callable[[bool], None] | None = None,
) -> ThroughputResult:
    """1 publisher process -> broker -> 1 subscriber process, ``total`` messages.
    ``timed``: called with True when the publisher starts its timed run, False when it
    has every ack (``bench.stall_probe`` watches the processes in between)."""
    ctx = mp.get_context("spawn")
    result = ThroughputResult(driver.name, total, window, batch)
    sub_rx, sub_tx = ctx.Pipe(duplex=False)
    pub_rx, pub_tx = ctx.Pipe(duplex=False)
    sub = ctx.Process(
        target=_subscriber_main, args=(driver, total, timeout, sub_tx), name="bench-sub"
    )
    pub = ctx.Process(
        target=_publisher_main,
        args=(driver, total, window, batch, timeout, pub_tx),
        name="bench-pub",
    )
    procs = [sub, pub]
    try:
        sub.start()
        expect_report(sub_rx, "ready", 30)
        cpu0 = cpu_seconds(broker_pids()) if broker_pids else None
        pub.start()
        expect_report(pub_rx, "ready", 60)
        if timed is not None:
            timed(True)
        pub_stats = PubStats(**expect_report(pub_rx, "done", timeout + 30))
        if timed is not None:
            timed(False)
        # a publisher that failed will not feed the subscriber: do not wait out its timeout
        sub_wait = 10.0 if pub_stats.error else timeout + 30
        try:
            sub_stats = SubStats(**expect_report(sub_rx, "done", sub_wait))
        except BenchError as exc:
            sub_stats = SubStats(error=str(exc))
        if broker_pids and cpu0 is not None:
            result.broker_cpu_s = cpu_seconds(broker_pids()) - cpu0
    except BenchError as exc:
        result.errors.append(str(exc))
        return result
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
    result.acked = pub_stats.acked
    result.delivered = sub_stats.delivered
    result.publisher_cpu_s = pub_stats.cpu_s
    result.subscriber_cpu_s = sub_stats.cpu_s
    result.publisher_user_s, result.publisher_sys_s = pub_stats.user_s, pub_stats.sys_s
    result.subscriber_user_s, result.subscriber_sys_s = sub_stats.user_s, sub_stats.sys_s
    for err in (pub_stats.error, sub_stats.error):
        if err:
            result.errors.append(err)
    t0 = pub_stats.t_start_ns
    if pub_stats.t_end_ns > t0:
        result.publish_rate = pub_stats.acked / ((pub_stats.t_end_ns - t0) / 1e9)
    if sub_stats.t_end_ns > t0:
        result.elapsed_s = (sub_stats.t_end_ns - t0) / 1e9
        result.deliver_rate = sub_stats.delivered / result.elapsed_s
    return result


# --------------------------------------------------------------------------------------------
# latency


@dataclass
class LatencyResult:
    broker: str
    samples: int
    p50_us: float = 0.0
    p95_us: float = 0.0
    p99_us: float = 0.0
    mean_us: float = 0.0
    min_us: float = 0.0
    max_us: float = 0.0
    errors: list[str] = field(default_factory=list)


def run_latency(
    driver: Driver, samples: int, *, warmup: int = 200, timeout: float = 60.0
) -> LatencyResult:
    """Sequential round trips: publish one message, wait for its delivery (the sample: send ->
    deliver received), ack it, and wait for the publisher ack before the next one."""
    result = LatencyResult(driver.name, samples)
    sub = driver.connect_subscriber()
    pub = driver.connect_publisher()
    counter = driver.ack_counter()
    scanner = driver.delivery_scanner()
    frames = [driver.publish_batch(i, 1) for i in range(warmup + samples)]
    taken: list[int] = []
    deadline = time.monotonic() + timeout
    clock = time.perf_counter_ns
    try:
        for i, frame in enumerate(frames):
            if time.monotonic() > deadline:
                result.errors.append(f"latency phase timed out after {len(taken)} samples")
                break
            t0 = clock()
            pub.send(frame)
            while True:
                consumed, delivered, reply = scanner.feed(sub.buf)
                del sub.buf[:consumed]
                if delivered:
                    break
                sub.fill()
            t1 = clock()
            if reply:
                sub.send(reply)
            acked = 0
            while not acked:
                consumed, acked = counter.feed(pub.buf)
                del pub.buf[:consumed]
                if not acked:
                    pub.fill()
            if i >= warmup:
                taken.append(t1 - t0)
    except (BenchError, OSError) as exc:
        result.errors.append(f"latency: {exc!r}")
    finally:
        driver.goodbye(pub)
        driver.goodbye(sub)
    result.samples = len(taken)
    for key, value in percentiles_us(taken).items():
        setattr(result, key, value)
    return result
