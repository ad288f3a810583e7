"""Helpers for the ZeroMQ bridge tests: a real ``vibemq-server`` process and real pyzmq sockets.

The server binds its PULL and PUB sockets to ``tcp://127.0.0.1:0`` and reports the bound
endpoints in its ready file. ZeroMQ's slow joiner: a SUB socket's subscription reaches the
PUB side some time after ``connect``, so :func:`ZmqPeer.sub` pushes probes at the prefix until
one comes back; probes are told apart from the test's messages by their address. Every wait
is bounded in time and count.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio
from serverproc import launch

WAIT = 5.0
PROBE = b".probe"
ZMQ_FLAGS = ("--zmq-pull", "tcp://127.0.0.1:0", "--zmq-pub", "tcp://127.0.0.1:0")


@dataclass
class Server:
    """One server process; ``ports`` is its ready file."""

    proc: asyncio.subprocess.Process
    ports: dict[str, Any]
    stderr_task: asyncio.Task[bytes]
    stderr: str = ""

    @property
    def port(self) -> int:
        return int(self.ports["vibemq"])

    @property
    def pull(self) -> str:
        return str(self.ports["zmq_pull"])

    @property
    def pub(self) -> str:
        return str(self.ports["zmq_pub"])

    async def stop(self, timeout: float = 10.0) -> int:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = await asyncio.wait_for(self.proc.wait(), timeout)
        self.stderr = (await asyncio.wait_for(self.stderr_task, timeout)).decode(errors="replace")
        return rc

    def log_events(self) -> list[dict[str, Any]]:
        events = []
        for line in self.stderr.splitlines():
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
        return events


async def start_server(
    tmp_path: Path, *flags: str, env: dict[str, str] | None = None, data: str = "data"
) -> Server:
    proc, info, stderr_task = await launch(
        tmp_path, tmp_path / data, "--drain-timeout", "2", *flags, env=env
    )
    return Server(proc, info, stderr_task)


@dataclass
class ZmqPeer:
    """PUSH and SUB sockets against one server; closes them all."""

    server: Server
    ctx: zmq.asyncio.Context = field(default_factory=zmq.asyncio.Context)
    sockets: list[zmq.asyncio.Socket] = field(default_factory=list)

    def socket(self, kind: int, **options: int) -> zmq.asyncio.Socket:
        sock = self.ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        for name, value in options.items():
            sock.setsockopt(getattr(zmq, name), value)
        self.sockets.append(sock)
        return sock

    def push(self) -> zmq.asyncio.Socket:
        sock = self.socket(zmq.PUSH)
        sock.connect(self.server.pull)
        return sock

    async def sub(self, prefix: bytes, **options: int) -> zmq.asyncio.Socket:
        """A SUB socket whose subscription to ``prefix`` has reached the server."""
        sock = self.socket(zmq.SUB, **options)
        sock.connect(self.server.pub)
        sock.subscribe(prefix)
        push = self.push()
        for _ in range(100):  # bounded: 100 probes, 50 ms apart
            await push.send_multipart([prefix + PROBE, b"probe"])
            if await sock.poll(50, zmq.POLLIN):
                await sock.recv_multipart()
                return sock
        raise AssertionError(f"subscription to {prefix!r} never reached the server")

    async def recv(self, sock: zmq.asyncio.Socket, timeout: float = WAIT) -> list[bytes]:
        """The next message that is not a probe."""
        async with asyncio.timeout(timeout):
            while True:
                frames = await sock.recv_multipart()
                if not frames[0].endswith(PROBE):
                    return list(frames)

    async def nothing(self, sock: zmq.asyncio.Socket, wait: float = 0.3) -> None:
        """No message (other than probes) arrives within ``wait`` seconds."""
        with contextlib.suppress(TimeoutError):
            frames = await self.recv(sock, wait)
            raise AssertionError(f"unexpected message {frames!r}")

    def close(self) -> None:
        for sock in self.sockets:
            sock.close(linger=0)
        self.ctx.term()
