"""Starting a real `vibemq-server` process in tests: its command line and a clean environment,
``launch`` and :class:`Servers` for async tests, :class:`ServerProcess` for synchronous
ones."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from waits import wait_until

#: How long a server process may take to write its ready file.
START_TIMEOUT = 15.0
#: How long a server process may take to exit once told to (or killed).
EXIT_TIMEOUT = 15.0
#: numbers the ready and log files of every server started (unique in a shared workdir)
_starts = itertools.count(1)


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without any VIBEMQ_* setting of the outer shell."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIBEMQ_")}
    env.update(extra)
    return env


def tokens_file(folder: Path, *tokens: str) -> str:
    """A ``--auth-tokens-file`` holding ``tokens`` (secrets never go in argv)."""
    path = folder / f"tokens-{len(list(folder.glob('tokens-*')))}.txt"
    path.write_text("# test tokens\n" + "".join(f"{token}\n" for token in tokens))
    return str(path)


def server_args(data_dir: Path, ready: Path, *flags: str) -> list[str]:
    """`python -m vibemq_server` on 127.0.0.1, any free port, JSON logs, a ready file."""
    return [
        sys.executable,
        "-m",
        "vibemq_server",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--mqtt-port",
        "0",
        "--amqp-port",
        "0",
        "--http-port",
        "0",
        "--http-tls-port",
        "0",
        "--ready-file",
        str(ready),
        "--data-dir",
        str(data_dir),
        "--log-format",
        "json",
        *flags,
    ]


async def launch(
    tmp_path: Path, data_dir: Path, *flags: str, env: dict[str, str] | None = None
) -> tuple[asyncio.subprocess.Process, dict[str, Any], asyncio.Future[bytes]]:
    """Start the server process and wait for its ready file: the process, what the ready
    file says (ports, endpoints) and the future of everything it writes to stderr."""
    ready = tmp_path / "ready.json"
    ready.unlink(missing_ok=True)
    proc = await asyncio.create_subprocess_exec(
        *server_args(data_dir, ready, *flags),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=env or clean_env(),
        cwd=tmp_path,
    )
    assert proc.stderr is not None
    stderr_task = asyncio.ensure_future(proc.stderr.read())
    try:
        async with asyncio.timeout(START_TIMEOUT):
            while not ready.exists():
                if proc.returncode is not None:
                    raise AssertionError(f"server exited with {proc.returncode}")
                await asyncio.sleep(0.02)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        err = await stderr_task
        raise AssertionError(f"server did not start: {err.decode(errors='replace')}") from None
    return proc, json.loads(ready.read_text()), stderr_task


class ServerProcess:
    """A ``vibemq-server`` process on port 0 (its log in a file), killed at the end whatever
    happened."""

    def __init__(self, workdir: Path, data_dir: Path) -> None:
        self.workdir = workdir
        self.data_dir = data_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.amqp_port = 0
        self.ports: dict[str, Any] = {}  # what the ready file says (vibemq, mqtt, amqp, ...)
        self.starts = 0

    def start(self, *flags: str, **env: str) -> ServerProcess:
        """``flags``: more command-line flags; ``env``: ``VIBEMQ_*`` settings."""
        self.starts += 1
        ready = self.workdir / f"ready{self.starts}.json"
        log = self.workdir / f"server{self.starts}.log"
        with log.open("wb") as log_file:
            self.proc = subprocess.Popen(
                server_args(self.data_dir, ready, *flags),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log_file,
                env=clean_env(**env),
                cwd=self.workdir,
            )
        proc = self.proc
        with contextlib.suppress(AssertionError):
            wait_until(lambda: ready.exists() or proc.poll() is not None, "", START_TIMEOUT)
        if not ready.exists():
            self.kill()
            raise AssertionError(f"server did not start:\n{log.read_text()}")
        self.ports = json.loads(ready.read_text())
        self.amqp_port = self.ports["amqp"]
        return self

    def peak_rss_mib(self) -> float:
        """The process's peak resident set (VmHWM) so far, in MiB."""
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmHWM in /proc/PID/status")

    def stop(self) -> None:
        """SIGTERM and wait (bounded) for a clean exit."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(15.0) == 0

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(15.0)


@dataclass
class ServerProc:
    """One server process of :class:`Servers` (async tests); its ports from its ready file."""

    proc: asyncio.subprocess.Process
    log_path: Path
    port: int = 0
    mqtt_port: int = 0

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    async def kill(self) -> None:
        """SIGKILL and reap."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        await asyncio.wait_for(self.proc.wait(), EXIT_TIMEOUT)

    async def stop(self) -> int:
        """SIGTERM; wait for the exit (bounded), return the exit code."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.proc.wait(), EXIT_TIMEOUT)

    async def wait_exit(self, timeout: float = EXIT_TIMEOUT) -> int:
        return await asyncio.wait_for(self.proc.wait(), timeout)


class Servers:
    """Starts server processes in ``workdir`` (their logs in files there, so nothing blocks
    on a full pipe) for async tests; ``cleanup`` kills whatever is still running."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[ServerProc] = []

    async def spawn(self, data_dir: Path, *flags: str) -> tuple[ServerProc, Path]:
        n = next(_starts)
        ready = self.workdir / f"ready{n}.json"
        log_path = self.workdir / f"server{n}.log"
        with log_path.open("wb") as log_file:
            proc = await asyncio.create_subprocess_exec(
                *server_args(data_dir, ready, *flags),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=log_file,
                env=clean_env(),
                cwd=self.workdir,
            )
        server = ServerProc(proc, log_path)
        self.procs.append(server)
        return server, ready

    async def start(self, data_dir: Path, *flags: str) -> ServerProc:
        """Start and wait until it is listening; fails with the server's log otherwise."""
        server, ready = await self.spawn(data_dir, *flags)
        try:
            async with asyncio.timeout(START_TIMEOUT):
                while not ready.exists():
                    if server.proc.returncode is not None:
                        break
                    await asyncio.sleep(0.01)
        except TimeoutError:
            pass
        if not ready.exists():
            await server.kill()
            raise AssertionError(
                f"server did not start (rc={server.proc.returncode}):\n{server.log}"
            )
        ports = json.loads(ready.read_text())
        server.port, server.mqtt_port = ports["vibemq"], ports.get("mqtt") or 0
        return server

    async def restart(self, server: ServerProc, data_dir: Path, *flags: str) -> ServerProc:
        """Stop ``server`` cleanly (exit status 0) and start a new one on ``data_dir``."""
        assert await server.stop() == 0, server.log
        return await self.start(data_dir, *flags)

    async def run_to_exit(self, data_dir: Path, *flags: str) -> tuple[int, str]:
        """Start a server that is expected to refuse to start: its exit code and log."""
        server, ready = await self.spawn(data_dir, *flags)
        try:
            rc = await server.wait_exit()
        except TimeoutError:
            await server.kill()
            raise AssertionError(f"server did not exit:\n{server.log}") from None
        assert not ready.exists(), "a server that refused to start wrote its ready file"
        return rc, server.log

    async def cleanup(self) -> None:
        for server in self.procs:
            with contextlib.suppress(Exception):
                await server.kill()
