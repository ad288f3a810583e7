"""Build the Docker image and run the broker in it, with podman (no Docker engine here).

Uses ``shared/tools/container-run.sh`` beside the repository: ``base`` makes the stand-in for
``python:3.11-slim`` (once per machine, ~5 min), ``build`` builds ./Dockerfile, ``run`` starts it
on the host network, ``stop`` sends SIGTERM. Everything the test talks to is on 127.0.0.1, over
the real VibeMQ wire protocol (the project's codec, no mocks).

Needs root and apt (the script installs podman, runc and debootstrap when they are missing).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from vibemq_server.protocol.codec import CommandType, FrameDecoder, Message, decode_body, encode

pytestmark = [pytest.mark.container, pytest.mark.timeout(2400)]

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
SCRIPT = SHARED / "tools" / "container-run.sh"
TAG = "vibemq-test:latest"
TOKEN = "secret"

BASE_TIMEOUT = 1200.0  # debootstrap of the stand-in base image, once per machine
BUILD_TIMEOUT = 1200.0  # pip downloads the dependency wheels
READY_TIMEOUT = 60.0
IO_TIMEOUT = 10.0
PODMAN = ["podman", "--runtime", "runc"]


def _run(
    args: list[str], timeout: float, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    if check and proc.returncode != 0:
        pytest.fail(
            f"{' '.join(args)} exited {proc.returncode}\n"
            f"--- stdout ---\n{proc.stdout[-6000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"
        )
    return proc


def _script(*args: str, timeout: float, check: bool = True) -> subprocess.CompletedProcess[str]:
    # apt-get inside the script must never wait for an answer.
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    return _run(["bash", str(SCRIPT), *args], timeout=timeout, check=check, env=env)


def _podman(
    *args: str, timeout: float = 60.0, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return _run([*PODMAN, *args], timeout=timeout, check=check)


def _inspect(kind: str, name: str) -> dict[str, Any]:
    out = _podman(kind, "inspect", name).stdout
    data = json.loads(out)
    assert isinstance(data, list) and data, out
    result: dict[str, Any] = data[0]
    return result


def _logs(name: str) -> str:
    proc = _podman("logs", name, check=False)
    return f"--- container logs ---\n{proc.stdout[-4000:]}{proc.stderr[-4000:]}"


_PACKAGE_DIGEST = (
    "import hashlib, pathlib, vibemq_server as m\n"
    "root = pathlib.Path(m.__file__).parent\n"
    "for p in sorted(root.rglob('*.py')):\n"
    "    print(p.relative_to(root).as_posix(), hashlib.sha256(p.read_bytes()).hexdigest())\n"
)


def _local_package_digest() -> dict[str, str]:
    # In the checkout vibemq_server/adapters is a symlink to the top-level adapters folder
    # (the wheel installs it as a real package): follow it, which Path.rglob does not.
    root = REPO / "vibemq_server"
    digest = {}
    for folder, _dirs, files in os.walk(root, followlinks=True):
        for name in files:
            if name.endswith(".py"):
                path = Path(folder) / name
                digest[path.relative_to(root).as_posix()] = hashlib.sha256(
                    path.read_bytes()
                ).hexdigest()
    return digest


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Client:
    """A minimal blocking VibeMQ client over a raw socket, using the project's codec."""

    def __init__(self, port: int, timeout: float = IO_TIMEOUT) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.timeout = timeout
        self.decoder = FrameDecoder()
        self.inbox: list[Message] = []
        self._n = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def next_id(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}-{self._n}-{uuid.uuid4().hex[:8]}"

    def send(self, msg: Message) -> None:
        self.sock.sendall(encode(msg))

    def wait_for(self, match: Callable[[Message], bool], what: str) -> Message:
        """The first received message that matches; others stay in the inbox."""
        deadline = time.monotonic() + self.timeout
        while True:
            for i, msg in enumerate(self.inbox):
                if match(msg):
                    return self.inbox.pop(i)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {what} within {self.timeout}s; got {self.inbox!r}")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            if not data:
                raise ConnectionError(f"connection closed waiting for {what}; got {self.inbox!r}")
            self.inbox.extend(decode_body(body) for body in self.decoder.feed(data))

    def reply_to(self, request_id: str, what: str) -> Message:
        return self.wait_for(
            lambda m: (
                m.id == request_id and m.type not in (CommandType.DELIVER, CommandType.DISCONNECT)
            ),
            what,
        )

    def request(self, msg: Message, expect: CommandType) -> Message:
        self.send(msg)
        reply = self.reply_to(msg.id, expect.name)
        assert reply.type == expect, (
            f"{msg.type.name} answered with {reply.type.name} "
            f"{reply.error_code}: {reply.error_message}"
        )
        return reply

    def connect(self, token: str | None = TOKEN) -> Message:
        headers = {"clientVersion": "container-test"}
        if token is not None:
            headers["authToken"] = token
        msg = Message(CommandType.CONNECT, self.next_id("conn"), headers=headers)
        self.send(msg)
        return self.reply_to(msg.id, "ConnectAck")


@dataclass
class Container:
    name: str
    port: int


@pytest.fixture(scope="module")
def image() -> str:
    assert SCRIPT.is_file(), f"{SCRIPT} is missing (shared/ must sit beside the repository)"
    t0 = time.monotonic()
    _script("base", timeout=BASE_TIMEOUT)
    t1 = time.monotonic()
    _script("build", str(REPO), TAG, timeout=BUILD_TIMEOUT)
    t2 = time.monotonic()
    size = _podman("images", "--format", "{{.Size}}", TAG).stdout.strip()
    print(f"\nbase image: {t1 - t0:.0f}s, build: {t2 - t1:.0f}s, {TAG}: {size}")
    return TAG


def _wait_ready(c: Container) -> None:
    """Poll until a Connect with the token is acknowledged, or fail with the logs."""
    deadline = time.monotonic() + READY_TIMEOUT
    last: BaseException | None = None
    while time.monotonic() < deadline:
        state = _inspect("container", c.name)["State"]
        if not state.get("Running"):
            pytest.fail(f"container exited early: {state}\n{_logs(c.name)}")
        try:
            with Client(c.port, timeout=3.0) as client:
                ack = client.connect()
                if ack.type == CommandType.CONNECT_ACK:
                    return
                last = AssertionError(f"Connect answered with {ack}")
        except (OSError, AssertionError, ConnectionError) as exc:
            last = exc
        time.sleep(0.5)
    pytest.fail(
        f"broker not ready on 127.0.0.1:{c.port} after {READY_TIMEOUT}s: {last!r}\n{_logs(c.name)}"
    )


@pytest.fixture
def container(image: str) -> Iterator[Container]:
    name = f"vibemq-test-{uuid.uuid4().hex[:10]}"
    port = _free_port()
    try:
        # --rm=false overrides the script's --rm, so the exit code can be read after a stop.
        _script(
            "run", image, "--name", name, "-d", "--rm=false",
            "-e", f"VIBEMQ_PORT={port}", "-e", f"VIBEMQ_AUTH_TOKENS={TOKEN}",
            # Host network: MQTT and AMQP on any free port, not on the host's 1883 / 5672.
            "-e", "VIBEMQ_MQTT__PORT=0", "-e", "VIBEMQ_AMQP__PORT=0",
            timeout=120,
        )  # fmt: skip
        c = Container(name, port)
        _wait_ready(c)
        yield c
    finally:
        _podman("rm", "--force", name, timeout=120, check=False)


def test_image_metadata(image: str) -> None:
    cfg = _inspect("image", image)
    config = cfg["Config"]
    user = config.get("User") or ""
    assert user and user.split(":")[0] not in ("0", "root"), f"image runs as root: {user!r}"
    health = config.get("Healthcheck") or cfg.get("Healthcheck") or {}
    test = health.get("Test") or []
    assert test and "vibemq_server.healthcheck" in " ".join(test), f"no healthcheck: {health}"
    assert {"2925/tcp", "1883/tcp", "5672/tcp"} <= set(config.get("ExposedPorts") or {}), config
    assert "/data" in (config.get("Volumes") or {}), config
    assert config.get("Entrypoint") == ["vibemq-server"], config
    assert not config.get("Cmd"), f"base image CMD leaked into the entrypoint args: {config}"
    assert config.get("StopSignal") in ("SIGTERM", "15"), config
    env = dict(e.split("=", 1) for e in config.get("Env") or [])
    assert env.get("VIBEMQ_HOST") == "0.0.0.0", env
    assert env.get("VIBEMQ_DATA_DIR") == "/data", env


def test_broker_in_container(container: Container) -> None:
    c = container

    # The image holds this checkout's code (a stale cached layer would test old code).
    out = _podman("exec", c.name, "python", "-c", _PACKAGE_DIGEST).stdout
    installed = dict(line.split(" ", 1) for line in out.splitlines() if line.strip())
    local = _local_package_digest()
    differ = sorted(k for k in installed.keys() | local.keys() if installed.get(k) != local.get(k))
    assert not differ, f"installed vibemq_server differs from the checkout in {differ}"

    # Runs as the unprivileged user, and that user can write to the data volume.
    probe = _podman(
        "exec", c.name, "python", "-c",
        "import os; open('/data/.probe', 'w').write('x'); os.remove('/data/.probe');"
        " print(os.getuid())",
    )  # fmt: skip
    assert probe.stdout.strip() not in ("", "0"), probe.stdout
    assert _inspect("container", c.name)["Config"]["User"].split(":")[0] not in ("", "0", "root")

    # Authentication is on (VIBEMQ_AUTH_TOKENS): a wrong token gets no ConnectAck.
    with Client(c.port) as intruder:
        try:
            refused = intruder.connect(token="wrong-token")
        except ConnectionError:
            pass  # closing the connection without an ack is a refusal too
        else:
            assert refused.type == CommandType.ERROR, refused
            assert refused.error_code == "AUTH_FAILED", refused

    queue = f"container-test-{uuid.uuid4().hex[:8]}"
    body = {"hello": "container", "n": 42}
    with Client(c.port) as sub, Client(c.port) as pub:
        assert sub.connect().type == CommandType.CONNECT_ACK
        assert pub.connect().type == CommandType.CONNECT_ACK

        pong = pub.request(Message(CommandType.PING, pub.next_id("ping")), CommandType.PONG)
        assert pong.type == CommandType.PONG

        sub.request(
            Message(CommandType.SUBSCRIBE, sub.next_id("sub"), queue=queue),
            CommandType.SUBSCRIBE_ACK,
        )
        publish = Message(
            CommandType.PUBLISH, pub.next_id("msg"), queue=queue, payload=json.dumps(body).encode()
        )
        ack = pub.request(publish, CommandType.PUBLISH_ACK)
        assert ack.id == publish.id

        delivered = sub.wait_for(lambda m: m.type == CommandType.DELIVER, "Deliver")
        assert delivered.queue == queue, delivered
        assert delivered.json() == body, delivered
        # Acknowledge it (the docs' form, header messageId; the id field is the original's).
        sub.send(Message(CommandType.ACK, delivered.id, headers={"messageId": delivered.id}))

    # The image's HEALTHCHECK passes (it authenticates with the first VIBEMQ_AUTH_TOKENS) ...
    health = _podman("healthcheck", "run", c.name, check=False, timeout=60)
    assert health.returncode == 0, f"healthcheck failed: {health}\n{_logs(c.name)}"
    # ... and it is a real check: a wrong token makes it fail.
    bad = _podman(
        "exec", c.name, "python", "-m", "vibemq_server.healthcheck", "--token", "wrong-token",
        check=False,
    )  # fmt: skip
    assert bad.returncode == 1, bad

    # SIGTERM (podman stop, 10 s grace) ends the broker cleanly: a connected client is told
    # (Disconnect, reason server_shutdown) and closes, and the exit code is 0, not a SIGKILL.
    with Client(c.port) as watcher:
        assert watcher.connect().type == CommandType.CONNECT_ACK
        t0 = time.monotonic()
        stop = subprocess.Popen(
            ["bash", str(SCRIPT), "stop", c.name],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            bye = watcher.wait_for(lambda m: m.type == CommandType.DISCONNECT, "Disconnect")
            assert bye.headers.get("reason") == "server_shutdown", bye
        finally:
            watcher.close()  # as a client does on Disconnect, so the broker's drain ends
            try:
                stop_out, _ = stop.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                stop.kill()
                stop_out, _ = stop.communicate()
    took = time.monotonic() - t0
    assert stop.returncode == 0, f"container-run.sh stop exited {stop.returncode}: {stop_out}"
    state = _inspect("container", c.name)["State"]
    assert not state.get("Running"), state
    assert state.get("ExitCode") == 0, (
        f"exit code {state.get('ExitCode')} after SIGTERM ({took:.1f}s)\n{_logs(c.name)}"
    )
