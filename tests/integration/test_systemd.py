"""The systemd unit (deploy/systemd/vibemq.service) and the broker's side of ``Type=notify``.

``systemd-analyze verify`` (Debian's systemd package) checks the unit with ExecStart pointed
at this environment's real ``vibemq-server`` (verify refuses a command that does not exist);
``systemd-analyze security`` bounds its exposure. A real broker process, given a
``$NOTIFY_SOCKET`` of the test's own, must say READY=1 once it listens, RELOADING=1 then
READY=1 around a SIGHUP, and STOPPING=1 when SIGTERM makes it drain.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from serverproc import clean_env, launch

from vibemq_server.cli import listening_status
from vibemq_server.server.sdnotify import Notifier

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "deploy" / "systemd" / "vibemq.service"
#: where docs/deploy.md installs the broker, and so the unit's ExecStart
INSTALLED = "/opt/vibemq/bin/vibemq-server"
WAIT_S = 15.0


def _systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    assert path, "systemd-analyze missing: apt-get install systemd (scripts/_system.sh does)"
    return path


def _settings(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


@pytest.fixture
def unit_here(tmp_path: Path) -> Path:
    """The unit, its ExecStart pointed at this environment's vibemq-server."""
    exe = Path(sys.executable).with_name("vibemq-server")
    assert exe.is_file(), f"{exe} missing: install the package into this venv"
    text = UNIT.read_text()
    assert f"ExecStart={INSTALLED}\n" in text
    unit = tmp_path / "vibemq.service"
    unit.write_text(text.replace(f"ExecStart={INSTALLED}", f"ExecStart={exe}"))
    return unit


def test_unit_passes_systemd_analyze_verify(unit_here: Path) -> None:
    done = subprocess.run(
        [_systemd_analyze(), "verify", str(unit_here)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # verify only warns about an unknown key or a bad value: any output is a finding.
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "", done.stderr
    assert done.stdout.strip() == "", done.stdout


def test_unit_exposure_stays_low(unit_here: Path) -> None:
    done = subprocess.run(
        [_systemd_analyze(), "security", "--offline=yes", "--threshold=20", str(unit_here)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_unit_says_what_deploy_md_promises() -> None:
    settings = _settings(UNIT.read_text())
    expected = {
        "Type": "notify",
        "User": "vibemq",
        "StateDirectory": "vibemq",
        "ConfigurationDirectory": "vibemq",
        "ExecReload": "/bin/kill -HUP $MAINPID",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "ReadWritePaths": "/var/lib/vibemq",
        "CapabilityBoundingSet": "",
        "LimitNOFILE": "65536",
    }
    for key, value in expected.items():
        assert settings.get(key) == [value], key
    assert "AF_INET" in settings["RestrictAddressFamilies"][0]


# -- the notification protocol --------------------------------------------------------------


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A unix datagram socket standing in for systemd's, and the value of $NOTIFY_SOCKET."""
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.setblocking(False)
    try:
        yield sock, str(path)
    finally:
        sock.close()


def _fields(datagram: bytes) -> dict[str, str]:
    return dict(line.split("=", 1) for line in datagram.decode().splitlines())


async def _next(sock: socket.socket) -> dict[str, str]:
    loop = asyncio.get_running_loop()
    return _fields(await asyncio.wait_for(loop.sock_recv(sock, 4096), WAIT_S))


async def test_broker_process_notifies_ready_reloading_stopping(
    tmp_path: Path, notify_socket: tuple[socket.socket, str]
) -> None:
    sock, address = notify_socket
    proc, ready, stderr = await launch(
        tmp_path, tmp_path / "data", env=clean_env(NOTIFY_SOCKET=address)
    )
    try:
        first = await _next(sock)
        # READY comes with the ready file: the journal is recovered and every listener up.
        assert first["READY"] == "1"
        assert first["STATUS"] == listening_status(ready)
        assert f"vibemq {ready['vibemq']}" in first["STATUS"]

        proc.send_signal(signal.SIGHUP)
        reloading = await _next(sock)
        assert reloading["RELOADING"] == "1"
        assert re.fullmatch(r"[0-9]+", reloading["MONOTONIC_USEC"])
        # the broker's monotonic clock is the machine's: the stamp is of this moment
        now_usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        assert int(reloading["MONOTONIC_USEC"]) <= now_usec
        again = await _next(sock)
        assert again["READY"] == "1"

        proc.send_signal(signal.SIGTERM)
        stopping = await _next(sock)
        assert stopping["STOPPING"] == "1"
        assert await asyncio.wait_for(proc.wait(), WAIT_S) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await stderr


def test_notifier_speaks_to_an_abstract_socket() -> None:
    name = f"vibemq-test-{os.getpid()}-{os.urandom(4).hex()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(WAIT_S)
        notifier = Notifier({"NOTIFY_SOCKET": "@" + name})
        assert notifier.enabled
        assert notifier.ready("listening: vibemq 2925")
        assert _fields(sock.recv(4096)) == {"READY": "1", "STATUS": "listening: vibemq 2925"}
        assert notifier.stopping()
        assert _fields(sock.recv(4096))["STOPPING"] == "1"


def test_notifier_without_systemd_does_nothing(tmp_path: Path) -> None:
    assert not Notifier({}).ready("x")
    # a socket that is not there: logged, never raised
    assert not Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")}).stopping()
    # an address family we do not speak (vsock)
    assert not Notifier({"NOTIFY_SOCKET": "vsock:2:1234"}).enabled
