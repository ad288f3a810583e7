"""Users, passwords and secure defaults over real sockets and real processes (issue 13, items
2 and 4): the ``vibemq-server users`` commands as subprocesses (passwords on stdin), the
users file on disk (hashes, mode 0600, concurrent writers, a corrupt file), reload without
restart, anonymous access from loopback only, wrong credentials refused on every protocol,
failed logins slowed per address and never a password in the logs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aio_pika
import paho.mqtt.client as mqtt
import pika
import pytest
from mqttkit import RawMqtt
from paho.mqtt.enums import CallbackAPIVersion
from rawclient import RawClient
from serverproc import clean_env, launch, server_args, tokens_file
from userskit import add_user, users
from waits import wait_for

from vibemq_server.client import Client
from vibemq_server.client.errors import VibeMQError
from vibemq_server.protocol import CommandType, Message
from vibemq_server.server import Broker

HOST = "127.0.0.1"
SECRET = "hunter2-Secret-Passw0rd"
WAIT = 10.0


# -- the users file -----------------------------------------------------------------------------


def test_users_commands_keep_hashes_in_a_0600_file(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    add_user(path, "alice", SECRET, "--tag", "administrator")
    add_user(path, "bob", "bob-pw")
    raw = path.read_text()
    assert SECRET not in raw and "bob-pw" not in raw
    doc = json.loads(raw)
    assert doc["users"]["alice"]["password_hash"].startswith("$scrypt$ln=")
    assert doc["users"]["alice"]["tags"] == ["administrator"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600

    listed = users(path, "list")
    assert listed.returncode == 0 and "alice" in listed.stdout and "bob" in listed.stdout
    assert "scrypt" not in listed.stdout  # hashes are never printed

    before = doc["users"]["bob"]["password_hash"]
    assert users(path, "passwd", "bob", "--password-stdin", password="new-pw").returncode == 0
    assert users(path, "tag", "bob", "monitoring").returncode == 0
    assert users(path, "permit", "bob", "--write", "^bob\\.", "--read", ".*").returncode == 0
    bob = json.loads(path.read_text())["users"]["bob"]
    assert bob["password_hash"] != before
    assert bob["tags"] == ["monitoring"]
    assert bob["permissions"] == {"configure": ".*", "write": "^bob\\.", "read": ".*"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600

    assert users(path, "delete", "bob").returncode == 0
    assert set(json.loads(path.read_text())["users"]) == {"alice"}
    # Mistakes are refused with a message and a non-zero status.
    assert users(path, "delete", "bob").returncode == 1
    again = users(path, "add", "alice", "--password-stdin", password="x")
    assert again.returncode == 1 and "already exists" in again.stderr
    assert users(path, "add", "carol", "--password-stdin", password="").returncode == 1
    assert users(path, "permit", "alice", "--read", "(").returncode == 1
    # A password is never an argument.
    assert users(path, "add", "dave", "pw").returncode == 2


def test_a_corrupt_users_file_is_refused_with_its_path(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    path.write_text('{"users": {"alice": {"password_hash": "plain"}}}')
    listed = users(path, "list")
    assert listed.returncode == 1 and str(path) in listed.stderr
    path.write_text("{not json")
    data_dir = tmp_path / "data"
    done = subprocess.run(
        [*server_args(data_dir, tmp_path / "ready.json"), "--users-file", str(path)],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
    )
    assert done.returncode == 2
    assert str(path) in done.stderr
    assert not (tmp_path / "ready.json").exists()


async def test_concurrent_users_add_while_the_broker_runs(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    proc, ready, _stderr = await launch(tmp_path, tmp_path / "data", "--users-file", str(path))
    try:
        names = [f"user{i}" for i in range(8)]
        adds = [
            await asyncio.create_subprocess_exec(
                sys.executable, "-m", "vibemq_server", "users", "--users-file", str(path),
                "add", name, "--password-stdin",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                env=clean_env(),
            )
            for name in names
        ]  # fmt: skip
        results = await asyncio.wait_for(
            asyncio.gather(
                *(p.communicate(f"pw-{n}\n".encode()) for p, n in zip(adds, names, strict=True))
            ),
            60,
        )
        assert [p.returncode for p in adds] == [0] * len(names), results
        assert set(json.loads(path.read_text())["users"]) == set(names)
        # The running broker took them all, without a restart: each logs in over MQTT.
        for name in names:
            await wait_for(
                lambda n=name: mqtt_login(ready["mqtt"], n, f"pw-{n}") == 0,  # type: ignore[misc]
                WAIT,
                f"{name} logs in",
            )
        assert mqtt_login(ready["mqtt"], "user0", "wrong") == 4
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)


def mqtt_login(port: int, username: str | None, password: str | None) -> int:
    """The CONNACK return code of one raw MQTT CONNECT."""
    raw = RawMqtt(port)
    try:
        fields: dict[str, Any] = {}
        if username is not None:
            fields["username"] = username
        if password is not None:
            fields["password"] = password.encode()
        return raw.connect(**fields).return_code
    finally:
        raw.close()


async def test_users_file_changes_apply_without_restart(
    broker_factory: Any, tmp_path: Path
) -> None:
    path = tmp_path / "users.json"
    add_user(path, "alice", "alice-pw")
    broker: Broker = await broker_factory(users_file=path)
    port = broker.mqtt_port
    assert port is not None
    loop = asyncio.get_running_loop()
    assert await loop.run_in_executor(None, mqtt_login, port, "alice", "alice-pw") == 0
    assert await loop.run_in_executor(None, mqtt_login, port, "bob", "bob-pw") == 4
    await loop.run_in_executor(None, add_user, path, "bob", "bob-pw")
    deadline = loop.time() + WAIT
    while await loop.run_in_executor(None, mqtt_login, port, "bob", "bob-pw") != 0:
        assert loop.time() < deadline, "bob never got in"
        await asyncio.sleep(0.1)
    await loop.run_in_executor(None, users, path, "delete", "alice")
    deadline = loop.time() + WAIT
    while await loop.run_in_executor(None, mqtt_login, port, "alice", "alice-pw") == 0:
        assert loop.time() < deadline, "alice was never removed"
        await asyncio.sleep(0.1)


async def test_sighup_reloads_the_users_file(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    proc, ready, _stderr = await launch(
        tmp_path,
        tmp_path / "data",
        "--users-file",
        str(path),
        "--auth-tokens-file",
        tokens_file(tmp_path, "tok:ops"),
    )
    try:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, add_user, path, "carol", "carol-pw")
        proc.send_signal(signal.SIGHUP)
        await wait_for(
            lambda: mqtt_login(ready["mqtt"], "carol", "carol-pw") == 0, WAIT, "carol logs in"
        )
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)


# -- secure by default --------------------------------------------------------------------------


def run_server(tmp_path: Path, *flags: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Start a server process; (its exit status, stderr) if it exits, else (-1, "") once it is
    ready (then stopped)."""
    ready = tmp_path / "ready.json"
    ready.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [*server_args(tmp_path / "data", ready), *flags],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env or clean_env(),
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and proc.poll() is None:
            assert time.monotonic() < deadline, "neither started nor exited"
            time.sleep(0.02)
        if proc.poll() is not None:
            _out, err = proc.communicate(timeout=30)
            return proc.returncode, err
        return -1, ""
    finally:
        if proc.poll() is None:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=30)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_a_network_listener_without_credentials_refuses_to_start(tmp_path: Path) -> None:
    status, err = run_server(tmp_path, "--host", "0.0.0.0")
    assert status == 2
    assert "0.0.0.0" in err and "allow_anonymous" in err and " add NAME" in err
    # One listener on the network is enough to refuse.
    status, err = run_server(tmp_path, "--no-amqp", env=clean_env(VIBEMQ_MQTT__HOST="0.0.0.0"))
    assert status == 2 and "mqtt on 0.0.0.0" in err


def test_a_network_listener_starts_with_credentials_or_explicit_anonymous(tmp_path: Path) -> None:
    assert run_server(tmp_path, "--host", "0.0.0.0", "--allow-anonymous") == (-1, "")
    env = clean_env(VIBEMQ_ALLOW_ANONYMOUS="true")
    assert run_server(tmp_path, "--host", "0.0.0.0", env=env) == (-1, "")
    assert run_server(
        tmp_path, "--host", "0.0.0.0", "--auth-tokens-file", tokens_file(tmp_path, "t:svc")
    ) == (-1, "")
    add_user(tmp_path / "data" / "users.json", "alice", "pw")
    assert run_server(tmp_path, "--host", "0.0.0.0") == (-1, "")


async def test_loopback_anonymous_clients_work_on_every_protocol(broker: Broker) -> None:
    loop = asyncio.get_running_loop()
    assert broker.mqtt_port is not None and broker.amqp_port is not None
    assert await loop.run_in_executor(None, mqtt_login, broker.mqtt_port, None, None) == 0
    # A user name alone is a label, as in Mosquitto.
    assert await loop.run_in_executor(None, mqtt_login, broker.mqtt_port, "sensor", None) == 0
    async with await Client.connect(HOST, broker.port) as client:
        assert await client.ping() >= 0
    conn = await aio_pika.connect(f"amqp://guest:guest@{HOST}:{broker.amqp_port}/", timeout=WAIT)
    await conn.close()


async def test_anonymous_can_be_turned_off_even_on_loopback(broker_factory: Any) -> None:
    broker: Broker = await broker_factory(allow_anonymous=False)
    assert broker.mqtt_port is not None
    loop = asyncio.get_running_loop()
    assert await loop.run_in_executor(None, mqtt_login, broker.mqtt_port, None, None) == 5
    c = await RawClient.open(broker.port)
    reply = await c.connect()
    assert reply.error_code == "AUTH_REQUIRED"


# -- wrong credentials, every protocol, every mode ----------------------------------------------

MODES: dict[str, dict[str, Any]] = {
    "anonymous": {},
    "users": {"users": {"alice": "alice-pw"}},
    "tokens": {"auth_tokens": ["tok:alice"]},
    "allow_anonymous": {"allow_anonymous": True, "users": {"alice": "alice-pw"}},
}


@pytest.mark.parametrize("mode", list(MODES))
async def test_wrong_credentials_are_refused_on_every_protocol(
    broker_factory: Any, mode: str
) -> None:
    broker: Broker = await broker_factory(auth_failure_delay_s=0, **MODES[mode])
    assert broker.mqtt_port is not None and broker.amqp_port is not None
    loop = asyncio.get_running_loop()
    # MQTT: CONNACK 4 (bad user name or password), as Mosquitto with a password file.
    assert await loop.run_in_executor(None, mqtt_login, broker.mqtt_port, "alice", "nope") == 4
    # AMQP: 403 ACCESS_REFUSED, closed as RabbitMQ closes it.
    with pytest.raises(aio_pika.exceptions.ProbableAuthenticationError) as refused:
        await aio_pika.connect(f"amqp://alice:nope@{HOST}:{broker.amqp_port}/", timeout=WAIT)
    assert "ACCESS_REFUSED" in str(refused.value)
    # VibeMQ: AUTH_FAILED, for a token or a name and password.
    with pytest.raises(VibeMQError) as failed:
        await Client.connect(HOST, broker.port, token="nope")
    assert failed.value.code == "AUTH_FAILED"
    c = await RawClient.open(broker.port)
    reply = await c.request(
        Message(CommandType.CONNECT, "c1", headers={"username": "alice", "password": "nope"})
    )
    assert reply.error_code == "AUTH_FAILED"
    assert await c.wait_closed() == []


def test_right_credentials_are_accepted_on_every_protocol(tmp_path: Path) -> None:
    """pika (PLAIN) and paho with a users-file user, and a token bound to that user."""
    add_user(tmp_path / "users.json", "alice", "alice-pw")

    async def main() -> None:
        proc, ready, _ = await launch(
            tmp_path,
            tmp_path / "data",
            "--users-file",
            str(tmp_path / "users.json"),
            "--auth-tokens-file",
            tokens_file(tmp_path, "tok-1:alice"),
        )
        try:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, check_clients, ready)
            async with await Client.connect(HOST, ready["vibemq"], token="tok-1") as client:
                assert await client.ping() >= 0
            c = await RawClient.open(ready["vibemq"])
            reply = await c.request(
                Message(
                    CommandType.CONNECT, "c1", headers={"username": "alice", "password": "alice-pw"}
                )
            )
            assert reply.type is CommandType.CONNECT_ACK
            await c.close()
        finally:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 30)

    asyncio.run(main())


def check_clients(ready: dict[str, Any]) -> None:
    for password in ("alice-pw", "tok-1"):
        conn = pika.BlockingConnection(
            pika.ConnectionParameters(
                HOST, ready["amqp"], credentials=pika.PlainCredentials("alice", password)
            )
        )
        conn.close()
        client = mqtt.Client(CallbackAPIVersion.VERSION2)
        client.username_pw_set("alice", password)
        client.connect(HOST, ready["mqtt"])
        assert client.loop(timeout=2) == 0
        client.disconnect()
    # guest/guest is the anonymous login, and there is none once users exist.
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        pika.BlockingConnection(pika.ConnectionParameters(HOST, ready["amqp"]))


# -- failed logins: slowed, logged without the password ------------------------------------------


async def test_failed_logins_are_slowed_per_address(broker_factory: Any) -> None:
    broker: Broker = await broker_factory(
        users={"alice": "alice-pw"}, auth_failure_delay_s=0.25, auth_failure_max_delay_s=2.0
    )
    port = broker.mqtt_port
    assert port is not None
    loop = asyncio.get_running_loop()
    waits = []
    for _ in range(4):
        start = loop.time()
        assert await loop.run_in_executor(None, mqtt_login, port, "alice", "guess") == 4
        waits.append(loop.time() - start)
    # 0.25, 0.5, 1.0, 2.0 s: lower bounds only (a loaded machine only makes them longer).
    assert waits[2] >= 0.9 and waits[3] >= 1.8, waits
    # The right password still gets in at once (no penalty on success).
    assert await loop.run_in_executor(None, mqtt_login, port, "alice", "alice-pw") == 0
    # Other protocols count against the same address: AMQP's refusal waits too.
    start = loop.time()
    with pytest.raises(aio_pika.exceptions.ProbableAuthenticationError):
        await aio_pika.connect(f"amqp://alice:guess@{HOST}:{broker.amqp_port}/", timeout=WAIT)
    assert loop.time() - start >= 1.8


async def test_connection_rate_limit_per_address(broker_factory: Any) -> None:
    broker: Broker = await broker_factory(connection_rate_limit=0.01, connection_rate_burst=2)
    first = await RawClient.open(broker.port)
    second = await RawClient.open(broker.port)
    third = await RawClient.open(broker.port)
    closed = await third.wait_closed()
    assert [m.error_code for m in closed] == ["CONNECTION_LIMIT"]
    assert (await first.connect()).type is CommandType.CONNECT_ACK
    assert (await second.connect()).type is CommandType.CONNECT_ACK
    await first.close()
    await second.close()


async def test_failed_logins_are_logged_without_the_password(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    await asyncio.get_running_loop().run_in_executor(None, add_user, path, "alice", "alice-pw")
    proc, ready, stderr = await launch(
        tmp_path,
        tmp_path / "data",
        "--users-file",
        str(path),
        "--auth-tokens-file",
        tokens_file(tmp_path, SECRET + "x:bob"),
    )
    try:
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, mqtt_login, ready["mqtt"], "alice", SECRET) == 4
        with pytest.raises(aio_pika.exceptions.ProbableAuthenticationError):
            await aio_pika.connect(f"amqp://alice:{SECRET}@{HOST}:{ready['amqp']}/", timeout=WAIT)
        with pytest.raises(VibeMQError):
            await Client.connect(HOST, ready["vibemq"], token=SECRET)
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)
    log = (await stderr).decode()
    assert SECRET not in log
    refusals = [json.loads(line) for line in log.splitlines() if '"login refused"' in line]
    assert {r["protocol"] for r in refusals} == {"mqtt", "amqp", "vibemq"}
    assert all(r["peer"] == HOST for r in refusals)
    assert {r["user"] for r in refusals} == {"alice", None}
