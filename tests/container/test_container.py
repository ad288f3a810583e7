"""Build the Docker image and run the broker in it, with podman (no Docker engine here).

Uses ``shared/tools/container-run.sh`` beside the repository: ``base`` makes the stand-in for
``python:3.11-slim`` (once per machine, ~5 min), ``build`` builds ./Dockerfile, ``run`` starts it
on the host network, ``stop`` sends SIGTERM. Everything the test talks to is on 127.0.0.1, over
the real VibeMQ wire protocol (the project's codec, no mocks).

Needs root and apt (the script installs podman, runc and debootstrap when they are missing).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pika
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from vibemq_server.client import Client as VibeClient
from vibemq_server.client import tls_context
from vibemq_server.protocol.codec import CommandType, FrameDecoder, Message, decode_body, encode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration"))
from certs import Pki, make_pki

pytestmark = [pytest.mark.container, pytest.mark.timeout(2400)]

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
SCRIPT = SHARED / "tools" / "container-run.sh"
# One tag per checkout: two worktrees testing at once must not run each other's image.
TAG = f"vibemq-test-{hashlib.sha256(str(REPO).encode()).hexdigest()[:8]}:latest"
TOKEN = "secret"
IMAGE_UID = 10001  # the image's vibemq user (Dockerfile ARG VIBEMQ_UID)

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
    """A minimal blocking VibeMQ client over a raw socket (TLS with ``tls``), using the
    project's codec."""

    def __init__(
        self, port: int, timeout: float = IO_TIMEOUT, tls: ssl.SSLContext | None = None
    ) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        if tls is not None:
            self.sock = tls.wrap_socket(self.sock, server_hostname="localhost")
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

    def connect(self, token: str | None = TOKEN, login: tuple[str, str] | None = None) -> Message:
        """Connect with ``token``, else with ``login`` (user name, password), else anonymous."""
        headers = {"clientVersion": "container-test"}
        if token is not None:
            headers["authToken"] = token
        elif login is not None:
            headers["username"], headers["password"] = login
        msg = Message(CommandType.CONNECT, self.next_id("conn"), headers=headers)
        self.send(msg)
        return self.reply_to(msg.id, "ConnectAck")


@dataclass
class Container:
    name: str
    port: int  # the VibeMQ port the test talks to (the TLS one in a TLS deployment)
    tls: ssl.SSLContext | None = None
    token: str | None = TOKEN  # how _wait_ready logs in: the token, else login, else anonymous
    login: tuple[str, str] | None = None


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
            with Client(c.port, timeout=3.0, tls=c.tls) as client:
                ack = client.connect(c.token, c.login)
                if ack.type == CommandType.CONNECT_ACK:
                    return
                last = AssertionError(f"Connect answered with {ack}")
        except (OSError, AssertionError, ConnectionError) as exc:
            last = exc
        time.sleep(0.5)
    pytest.fail(
        f"broker not ready on 127.0.0.1:{c.port} after {READY_TIMEOUT}s: {last!r}\n{_logs(c.name)}"
    )


def _container_name() -> str:
    return f"vibemq-test-{uuid.uuid4().hex[:10]}"


def _env_args(env: dict[str, str]) -> list[str]:
    return [arg for key, value in env.items() for arg in ("-e", f"{key}={value}")]


@contextlib.contextmanager
def _started(image: str, env: dict[str, str], *run_args: str, c: Container) -> Iterator[Container]:
    """The broker container ``c`` running (removed afterwards in any case), ready."""
    name = c.name
    try:
        # --rm=false overrides the script's --rm, so the exit code can be read after a stop.
        _script("run", image, "--name", name, "-d", "--rm=false", *_env_args(env), *run_args,
                timeout=120)  # fmt: skip
        _wait_ready(c)
        yield c
    finally:
        _podman("rm", "--force", name, timeout=120, check=False)


@pytest.fixture
def container(image: str) -> Iterator[Container]:
    port = _free_port()
    env = {
        "VIBEMQ_PORT": str(port),
        "VIBEMQ_AUTH_TOKENS": TOKEN,
        # Host network: MQTT and AMQP on any free port, not on the host's 1883 / 5672.
        "VIBEMQ_MQTT__PORT": "0",
        "VIBEMQ_AMQP__PORT": "0",
    }
    with _started(image, env, c=Container(_container_name(), port)) as c:
        yield c


def test_image_metadata(image: str) -> None:
    cfg = _inspect("image", image)
    config = cfg["Config"]
    user = config.get("User") or ""
    assert user and user.split(":")[0] not in ("0", "root"), f"image runs as root: {user!r}"
    health = config.get("Healthcheck") or cfg.get("Healthcheck") or {}
    test = health.get("Test") or []
    assert test and "vibemq_server.healthcheck" in " ".join(test), f"no healthcheck: {health}"
    exposed = set(config.get("ExposedPorts") or {})
    plain, tls = {"2925/tcp", "1883/tcp", "5672/tcp"}, {"2926/tcp", "8883/tcp", "5671/tcp"}
    assert plain | tls <= exposed, config
    labels = config.get("Labels") or {}
    assert "planned" not in labels.get("org.opencontainers.image.description", ""), labels
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


# -- a TLS deployment: certificates mounted read-only, TLS-only listeners ------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("certs")
    made = make_pki(directory)
    # As a deployment keeps them: the key private to the image's user (it runs as uid 10001,
    # so a root-owned 0600 key would be unreadable), the certificates world-readable.
    for path in directory.iterdir():
        os.chown(path, IMAGE_UID, IMAGE_UID)
        path.chmod(0o600 if path.suffix == ".key" else 0o644)
    directory.chmod(0o755)
    return made


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free ports (held open together, so none is picked twice)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


async def _native_round_trip(port: int, ctx: ssl.SSLContext) -> None:
    """Our client library over TLS: create, subscribe, publish, receive, ack."""
    queue = f"docker-tls-{uuid.uuid4().hex[:8]}"
    body = {"over": "tls", "n": 1}
    async with await VibeClient.connect(
        "127.0.0.1", port, token=TOKEN, ssl_context=ctx, reconnect=False,
        connect_timeout=IO_TIMEOUT, request_timeout=IO_TIMEOUT,
    ) as client:  # fmt: skip
        await client.create_queue(queue)
        sub = await client.subscribe(queue)
        await client.publish(queue, body)
        got = await sub.get(timeout=IO_TIMEOUT)
        assert got.payload == body, got
        await got.ack()


def _mqtt_round_trip(port: int, pki: Pki) -> None:
    """paho-mqtt with ``tls_set`` (the CA only): subscribe and publish at QoS 1."""
    topic = f"docker/tls/{uuid.uuid4().hex[:8]}"
    connected, subscribed = threading.Event(), threading.Event()
    codes: list[str] = []
    received: list[bytes] = []
    got = threading.Event()
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"docker-{topic[-8:]}")

    def on_connect(_c: Any, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        codes.append(str(reason))
        connected.set()

    def on_message(_c: Any, _u: Any, msg: Any) -> None:
        received.append(msg.payload)
        got.set()

    client.on_connect = on_connect
    client.on_subscribe = lambda *_args: subscribed.set()
    client.on_message = on_message
    client.username_pw_set("container", TOKEN)  # a token is a password on every protocol
    client.tls_set(ca_certs=str(pki.ca))
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        assert connected.wait(IO_TIMEOUT) and codes == ["Success"], codes
        client.subscribe(topic, qos=1)
        assert subscribed.wait(IO_TIMEOUT), "no SUBACK"
        client.publish(topic, b"mqtts", qos=1).wait_for_publish(IO_TIMEOUT)
        assert got.wait(IO_TIMEOUT) and received == [b"mqtts"], received
    finally:
        client.disconnect()
        client.loop_stop()


def _amqp_round_trip(port: int, ctx: ssl.SSLContext) -> None:
    """pika over ``SSLOptions``: a confirmed publish to a queue, then basic.get."""
    queue = f"docker-amqps-{uuid.uuid4().hex[:8]}"
    params = pika.ConnectionParameters(
        "127.0.0.1", port,
        credentials=pika.PlainCredentials("container", TOKEN),
        ssl_options=pika.SSLOptions(ctx, "localhost"),
        socket_timeout=IO_TIMEOUT, blocked_connection_timeout=IO_TIMEOUT,
    )  # fmt: skip
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(queue)
        ch.basic_publish("", queue, b"amqps")  # returns once confirmed
        _method, _props, body = ch.basic_get(queue, auto_ack=True)
        assert body == b"amqps", body
    finally:
        conn.close()


def test_tls_deployment(image: str, pki: Pki) -> None:
    """README's TLS deployment: certificates mounted read-only at /certs, every protocol on
    its TLS port only, a token; round trips from the host on the three TLS ports, the plain
    VibeMQ port closed, and the image's health check going over TLS by itself."""
    vibemq_tls, mqtt_tls, amqp_tls, plain = _free_ports(4)
    env = {
        "VIBEMQ_AUTH_TOKENS": TOKEN,
        "VIBEMQ_PORT": str(plain),
        "VIBEMQ_TLS__CERT_FILE": "/certs/server.pem",
        "VIBEMQ_TLS__KEY_FILE": "/certs/server.key",
        "VIBEMQ_TLS__PORT": str(vibemq_tls),
        "VIBEMQ_TLS__MQTT_PORT": str(mqtt_tls),
        "VIBEMQ_TLS__AMQP_PORT": str(amqp_tls),
        "VIBEMQ_TLS__PLAIN_VIBEMQ": "false",
        "VIBEMQ_TLS__PLAIN_MQTT": "false",
        "VIBEMQ_TLS__PLAIN_AMQP": "false",
    }
    ctx = tls_context(str(pki.ca))
    mount = f"{pki.ca.parent}:/certs:ro"
    with _started(image, env, "-v", mount, c=Container(_container_name(), vibemq_tls, ctx)) as c:
        # The mount is read-only, and the key was readable by the broker (it is listening).
        ro = _podman("exec", c.name, "sh", "-c", "touch /certs/x", check=False)
        assert ro.returncode != 0, ro

        asyncio.run(_native_round_trip(vibemq_tls, ctx))
        _mqtt_round_trip(mqtt_tls, pki)
        _amqp_round_trip(amqp_tls, ctx)

        # TLS-only: nothing answers on the plain VibeMQ port.
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", plain), timeout=IO_TIMEOUT).close()

        # The image's HEALTHCHECK passes, and it went to the TLS port (plain VibeMQ is off).
        health = _podman("healthcheck", "run", c.name, check=False, timeout=60)
        assert health.returncode == 0, f"healthcheck failed: {health}\n{_logs(c.name)}"
        probe = _podman("exec", c.name, "python", "-m", "vibemq_server.healthcheck")
        assert probe.stdout.strip() == f"healthy: 127.0.0.1:{vibemq_tls}", probe

        _script("stop", c.name, timeout=60)
        state = _inspect("container", c.name)["State"]
        assert state.get("ExitCode") == 0, f"{state}\n{_logs(c.name)}"


# -- credentials: the image starts only with some (secure by default) ----------------------------


def _plain_env(port: int) -> dict[str, str]:
    # Host network: MQTT and AMQP on any free port, not on the host's 1883 / 5672.
    return {"VIBEMQ_PORT": str(port), "VIBEMQ_MQTT__PORT": "0", "VIBEMQ_AMQP__PORT": "0"}


def _podman_run(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """A one-off command in the image (container-run.sh's flags), with ``stdin``."""
    return subprocess.run(
        [*PODMAN, "run", "--rm", "-i", "--ulimit", "nofile=1024:1024",
         "--ulimit", "nproc=1024:1024", "--network", "host", "--pull=never", *args],
        input=stdin, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_refuses_to_start_without_credentials(image: str) -> None:
    """No token, no users file, no VIBEMQ_ALLOW_ANONYMOUS: exit 2, saying how to fix it; and
    the users command it suggests works as written."""
    env = _plain_env(_free_port())
    done = _script("run", image, *_env_args(env), timeout=120, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 2, f"exit {done.returncode}\n{out[-4000:]}"
    assert "refusing to start" in out, out[-4000:]
    for fix in ("VIBEMQ_AUTH_TOKENS", "VIBEMQ_ALLOW_ANONYMOUS=true"):
        assert fix in out, f"{fix!r} not in the refusal:\n{out[-4000:]}"
    hint = re.search(r"\(vibemq-server (users [^)]*)\)", out)
    assert hint, f"no users command in the refusal:\n{out[-4000:]}"
    command = hint.group(1).replace("NAME", "alice").split()
    volume = f"vibemq-test-{uuid.uuid4().hex[:10]}"
    _podman("volume", "create", volume)
    try:
        added = _podman_run(
            "-v", f"{volume}:/data", image, *command, "--password-stdin", stdin="pw\n"
        )
        assert added.returncode == 0, added
        listed = _podman_run("-v", f"{volume}:/data", image, "users", "list")
        assert listed.returncode == 0 and "alice" in listed.stdout, listed
    finally:
        _podman("volume", "rm", "--force", volume, check=False)


def test_explicit_anonymous(image: str) -> None:
    """VIBEMQ_ALLOW_ANONYMOUS=true: anonymous clients from the network, health check without
    credentials."""
    port = _free_port()
    env = {**_plain_env(port), "VIBEMQ_ALLOW_ANONYMOUS": "true"}
    with _started(image, env, c=Container(_container_name(), port, token=None)) as c:
        with Client(c.port) as client:
            assert client.connect(token=None).type == CommandType.CONNECT_ACK
            client.request(Message(CommandType.PING, client.next_id("ping")), CommandType.PONG)
        health = _podman("healthcheck", "run", c.name, check=False, timeout=60)
        assert health.returncode == 0, f"healthcheck failed: {health}\n{_logs(c.name)}"


def test_mounted_users_file(image: str, tmp_path: Path) -> None:
    """A users file made on the host with `vibemq-server users`, its directory mounted
    read-only: that user logs in, a wrong password and an anonymous login are refused, and the
    health check logs in as VIBEMQ_HEALTHCHECK_USERNAME."""
    users = tmp_path / "users"
    users.mkdir()
    password = uuid.uuid4().hex
    made = subprocess.run(
        [sys.executable, "-m", "vibemq_server", "users", "--users-file", str(users / "users.json"),
         "add", "alice", "--password-stdin"],
        input=f"{password}\n", capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made
    # The file is 0600 (written by the users command): the image's user must own it.
    for path in (users, *users.iterdir()):
        os.chown(path, IMAGE_UID, IMAGE_UID)
    port = _free_port()
    env = {
        **_plain_env(port),
        "VIBEMQ_USERS_FILE": "/etc/vibemq/users.json",
        "VIBEMQ_HEALTHCHECK_USERNAME": "alice",
        "VIBEMQ_HEALTHCHECK_PASSWORD": password,
    }
    c = Container(_container_name(), port, token=None, login=("alice", password))
    with _started(image, env, "-v", f"{users}:/etc/vibemq:ro", c=c):
        with Client(c.port) as intruder:
            try:
                refused = intruder.connect(token=None, login=("alice", "wrong"))
            except ConnectionError:
                pass  # closed without an ack: refused too
            else:
                assert refused.type == CommandType.ERROR, refused
                assert refused.error_code == "AUTH_FAILED", refused
        with Client(c.port) as anonymous:
            try:
                refused = anonymous.connect(token=None)
            except ConnectionError:
                pass
            else:
                assert refused.type == CommandType.ERROR, refused
        health = _podman("healthcheck", "run", c.name, check=False, timeout=60)
        assert health.returncode == 0, f"healthcheck failed: {health}\n{_logs(c.name)}"


def test_users_made_in_the_volume(image: str) -> None:
    """docs/docker.md's first users-file recipe: the image's own `users add` writes
    /data/users.json into a named volume; a broker on that volume lets the user in."""
    volume = f"vibemq-test-{uuid.uuid4().hex[:10]}"
    password = uuid.uuid4().hex
    _podman("volume", "create", volume)
    try:
        added = _podman_run(
            "-v", f"{volume}:/data", image, "users", "add", "alice", "--password-stdin",
            stdin=f"{password}\n",
        )  # fmt: skip
        assert added.returncode == 0, added
        port = _free_port()
        env = {
            **_plain_env(port),
            "VIBEMQ_HEALTHCHECK_USERNAME": "alice",
            "VIBEMQ_HEALTHCHECK_PASSWORD": password,
        }
        c = Container(_container_name(), port, token=None, login=("alice", password))
        with _started(image, env, "-v", f"{volume}:/data", c=c):
            health = _podman("healthcheck", "run", c.name, check=False, timeout=60)
            assert health.returncode == 0, f"healthcheck failed: {health}\n{_logs(c.name)}"
    finally:
        _podman("volume", "rm", "--force", volume, check=False)
