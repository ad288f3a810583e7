"""Starting a real `vibemq-server` process in tests: its command line and a clean environment."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

#: How long a server process may take to write its ready file.
START_TIMEOUT = 15.0


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without any VIBEMQ_* setting of the outer shell."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIBEMQ_")}
    env.update(extra)
    return env


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
