"""TLS on every listener, with real clients and certificates made in the test (certs.py):
round trips with paho, aiomqtt, pika, aio-pika, the mosquitto tools, openssl s_client, our own
client and CLI; mutual TLS with the certificate as the login; and bad input, each refused
with a log line while every other client carries on and nothing stored is lost."""

from __future__ import annotations

import asyncio
import os
import select
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aio_pika
import aiomqtt
import pika
import pytest
from certs import Issued, Pki, make_pki, tls_settings
from mqttkit import HOST, unique_id
from mqttutil import Clients, LogEntries, MakeBroker, Paho, ThreadBroker
from serverproc import clean_env, launch
from waits import wait_until

from vibemq_server.client import Client, tls_context
from vibemq_server.config import Config
from vibemq_server.server import Broker
from vibemq_server.server.tls import reload as reload_tls

WAIT = 10.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def ports(broker: ThreadBroker) -> dict[str, Any]:
    return broker.call(lambda b: b.ready())


def client_ctx(pki: Pki, issued: Issued | None = None, ca: Path | None = None) -> ssl.SSLContext:
    return tls_context(
        str(ca or pki.ca),
        str(issued.cert) if issued else None,
        str(issued.key) if issued else None,
    )


def tls_paho(
    clients: Clients, port: int, pki: Pki, issued: Issued | None = None, **kw: Any
) -> Paho:
    client = clients.paho(port, **kw)
    client.client.tls_set(
        ca_certs=str(pki.ca),
        certfile=str(issued.cert) if issued else None,
        keyfile=str(issued.key) if issued else None,
    )
    return client


def log_events(entries: LogEntries, event: str) -> list[dict[str, Any]]:
    return [e for e in entries if e.get("event") == event]


@pytest.fixture
def tls_broker(make_mqtt_broker: MakeBroker, pki: Pki) -> ThreadBroker:
    return make_mqtt_broker(tls=tls_settings(pki, handshake_timeout_s=1.0))


# -- listeners and the ready file ---------------------------------------------------------------


def test_tls_listeners_open_next_to_the_plain_ones(tls_broker: ThreadBroker) -> None:
    ready = ports(tls_broker)
    keys = ("vibemq", "mqtt", "amqp", "vibemq_tls", "mqtt_tls", "amqp_tls", "http", "http_tls")
    for key in keys:
        assert isinstance(ready[key], int) and ready[key] > 0, key
    assert len({ready[k] for k in keys}) == 8


def test_no_certificate_no_tls_listener(mqtt_broker: ThreadBroker) -> None:
    ready = ports(mqtt_broker)
    assert ready["mqtt_tls"] is None and ready["amqp_tls"] is None
    assert ready["vibemq_tls"] is None


def test_tls_only_deployment(make_mqtt_broker: MakeBroker, pki: Pki, mqtt_clients: Clients) -> None:
    broker = make_mqtt_broker(
        tls=tls_settings(pki, plain_vibemq=False, plain_mqtt=False, plain_amqp=False)
    )
    ready = ports(broker)
    assert ready["vibemq"] is None and ready["mqtt"] is None and ready["amqp"] is None
    client = tls_paho(mqtt_clients, ready["mqtt_tls"], pki).connected()
    assert client.subscribe(("only/tls", 1)) == [1]
    client.publish("only/tls", b"x", qos=1)
    assert client.get().payload == b"x"


def test_config_refuses_inconsistent_tls(pki: Pki) -> None:
    with pytest.raises(ValueError, match="ca_file"):
        Config(tls={"cert_file": pki.server.cert, "require_client_cert": True})
    with pytest.raises(ValueError, match="plain listener"):
        Config(tls={"plain_mqtt": False})


# -- round trips with real clients ---------------------------------------------------------------


def test_paho_round_trip_and_cross_to_plain(
    tls_broker: ThreadBroker, pki: Pki, mqtt_clients: Clients
) -> None:
    ready = ports(tls_broker)
    sub = tls_paho(mqtt_clients, ready["mqtt_tls"], pki).connected()
    assert sub.subscribe(("tls/+", 1)) == [1]
    pub = tls_paho(mqtt_clients, ready["mqtt_tls"], pki).connected()
    plain = mqtt_clients.paho(ready["mqtt"]).connected()
    pub.publish("tls/a", b"over tls", qos=1)
    plain.publish("tls/b", b"over tcp", qos=0)
    got = {sub.get().payload, sub.get().payload}
    assert got == {b"over tls", b"over tcp"}


async def test_aiomqtt_round_trip(tls_broker: ThreadBroker, pki: Pki) -> None:
    port = ports(tls_broker)["mqtt_tls"]
    params = aiomqtt.TLSParameters(ca_certs=str(pki.ca))
    async with aiomqtt.Client(HOST, port, tls_params=params, identifier=unique_id("aio")) as c:
        await c.subscribe("aio/t", qos=1)
        await c.publish("aio/t", b"hello", qos=1)
        async with asyncio.timeout(WAIT):
            async for message in c.messages:
                assert message.payload == b"hello"
                break


def test_pika_ssl_options(tls_broker: ThreadBroker, pki: Pki) -> None:
    port = ports(tls_broker)["amqp_tls"]
    params = pika.ConnectionParameters(
        HOST,
        port,
        ssl_options=pika.SSLOptions(client_ctx(pki), "localhost"),
        connection_attempts=1,
        socket_timeout=WAIT,
        blocked_connection_timeout=WAIT,
    )
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        ch.queue_declare("tls-pika")
        ch.basic_publish("", "tls-pika", b"amqps")
        method, _props, body = ch.basic_get("tls-pika", auto_ack=True)
        assert method is not None and body == b"amqps"
    finally:
        conn.close()


async def test_aio_pika_amqps(tls_broker: ThreadBroker, pki: Pki) -> None:
    port = ports(tls_broker)["amqp_tls"]
    conn = await aio_pika.connect(
        f"amqps://guest:guest@localhost:{port}/", ssl_context=client_ctx(pki), timeout=WAIT
    )
    async with conn:
        channel = await conn.channel()
        queue = await channel.declare_queue("tls-aio-pika")
        await channel.default_exchange.publish(aio_pika.Message(b"hi"), "tls-aio-pika")
        async with asyncio.timeout(WAIT):
            while (msg := await queue.get(fail=False)) is None:
                await asyncio.sleep(0.02)
        assert msg.body == b"hi"
        await msg.ack()


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is not installed (apt-get install mosquitto-clients openssl)"
    return path


def test_mosquitto_tools_with_cafile(tls_broker: ThreadBroker, pki: Pki) -> None:
    port = str(ports(tls_broker)["mqtt_tls"])
    common = ["-h", "localhost", "-p", port, "--cafile", str(pki.ca), "-q", "1"]
    sub = subprocess.Popen(
        [_tool("mosquitto_sub"), *common, "-t", "cli/tls", "-C", "1", "-W", "10"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_until(lambda: tls_broker.has_filter("cli/tls"), "mosquitto_sub subscribed")
        subprocess.run(
            [_tool("mosquitto_pub"), *common, "-t", "cli/tls", "-m", "via mosquitto"],
            check=True,
            timeout=WAIT,
        )
        out, err = sub.communicate(timeout=WAIT)
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.wait(WAIT)
    assert sub.returncode == 0, err
    assert out.strip() == b"via mosquitto"


def _s_client(port: int, *args: str, data: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [_tool("openssl"), "s_client", "-connect", f"127.0.0.1:{port}", *args],
        input=data,
        capture_output=True,
        timeout=WAIT,
    )


def test_openssl_s_client_verifies(tls_broker: ThreadBroker, pki: Pki) -> None:
    port = ports(tls_broker)["amqp_tls"]
    proc = subprocess.Popen(
        [
            _tool("openssl"),
            *("s_client", "-connect", f"127.0.0.1:{port}", "-CAfile", str(pki.ca)),
            *("-verify_return_error", "-ign_eof"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdin is not None and proc.stdout is not None
    out = b""
    try:
        # The AMQP header through TLS: the broker answers with connection.start.
        proc.stdin.write(b"AMQP\0\0\x09\x01")
        proc.stdin.flush()
        os.set_blocking(proc.stdout.fileno(), False)
        deadline = time.monotonic() + WAIT
        while b"AMQPLAIN" not in out and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 0.1)
            if ready:
                out += proc.stdout.read() or b""
    finally:
        proc.kill()
        proc.wait(WAIT)
    assert b"Verify return code: 0 (ok)" in out
    assert b"PLAIN AMQPLAIN" in out


async def test_own_client_and_cli_over_tls(make_mqtt_broker: MakeBroker, pki: Pki) -> None:
    broker = make_mqtt_broker(tls=tls_settings(pki))
    port = ports(broker)["vibemq_tls"]
    async with await Client.connect(HOST, port, ssl_context=client_ctx(pki)) as client:
        await client.create_queue("tls-native")
        await client.publish("tls-native", {"n": 1})
    cli = [sys.executable, "-m", "vibemq_server.client.cli", "--port", str(port)]
    published = subprocess.run(
        [*cli, "--cafile", str(pki.ca), "publish", "tls-native", '{"n": 2}'],
        capture_output=True,
        timeout=WAIT,
        env=clean_env(),
    )
    assert published.returncode == 0, published.stderr
    got = subprocess.run(
        [*cli, "--cafile", str(pki.ca), "subscribe", "tls-native", "--count", "2"],
        capture_output=True,
        timeout=WAIT,
        env=clean_env(),
    )
    assert got.returncode == 0, got.stderr
    assert b'"n": 1' in got.stdout and b'"n": 2' in got.stdout
    # Without the CA the server is not trusted: a clear error, no traceback.
    untrusted = subprocess.run(
        [*cli, "--tls", "list-queues"], capture_output=True, timeout=WAIT, env=clean_env()
    )
    assert untrusted.returncode == 1
    assert b"CERTIFICATE_VERIFY_FAILED" in untrusted.stderr
    assert b"Traceback" not in untrusted.stderr


# -- mutual TLS: the certificate is the login ----------------------------------------------------


@pytest.fixture
def mtls_broker(make_mqtt_broker: MakeBroker, pki: Pki) -> ThreadBroker:
    # Users are configured, so a login without the certificate would need a password.
    return make_mqtt_broker(
        users={"carol": "secret"},
        tls=tls_settings(pki, require_client_cert=True, use_identity_as_username=True),
    )


def _usernames(broker: ThreadBroker, attr: str) -> list[str]:
    def collect(b: Broker) -> list[str]:
        found = []
        for conn in b.connections:
            session = getattr(conn, "session", None)
            if session is not None and getattr(session, attr, None) is not None:
                found.append(str(getattr(session, attr)))
        return found

    return broker.call(collect)


def test_mqtt_identity_as_username(
    mtls_broker: ThreadBroker, pki: Pki, mqtt_clients: Clients
) -> None:
    ready = ports(mtls_broker)
    alice = tls_paho(mqtt_clients, ready["mqtt_tls"], pki, pki.alice).connected()
    assert alice.subscribe(("id/t", 1)) == [1]
    bob = tls_paho(mqtt_clients, ready["mqtt_tls"], pki, pki.bob)  # no CN: the SAN
    bob.connected().publish("id/t", b"from bob", qos=1)
    assert alice.get().payload == b"from bob"
    # The plain listener still wants the password.
    plain = mqtt_clients.paho(ready["mqtt"])
    assert plain.connect().is_failure


def test_amqp_external_mechanism(mtls_broker: ThreadBroker, pki: Pki) -> None:
    port = ports(mtls_broker)["amqp_tls"]
    params = pika.ConnectionParameters(
        HOST,
        port,
        credentials=pika.credentials.ExternalCredentials(),
        ssl_options=pika.SSLOptions(client_ctx(pki, pki.alice), "localhost"),
        connection_attempts=1,
        socket_timeout=WAIT,
    )
    conn = pika.BlockingConnection(params)
    try:
        assert "alice" in _usernames(mtls_broker, "username")
        ch = conn.channel()
        ch.queue_declare("ext")
    finally:
        conn.close()


async def test_aio_pika_external(mtls_broker: ThreadBroker, pki: Pki) -> None:
    port = ports(mtls_broker)["amqp_tls"]
    conn = await aio_pika.connect(
        f"amqps://localhost:{port}/?auth=external",
        ssl_context=client_ctx(pki, pki.alice),
        timeout=WAIT,
    )
    async with conn:
        assert "alice" in _usernames(mtls_broker, "username")
        channel = await conn.channel()
        await channel.declare_queue("ext-aio")


def test_cli_mutual_tls(mtls_broker: ThreadBroker, pki: Pki) -> None:
    port = str(ports(mtls_broker)["vibemq_tls"])
    cli = [sys.executable, "-m", "vibemq_server.client.cli", "--port", port, "--cafile"]
    mutual = [*cli, str(pki.ca), "--cert", str(pki.alice.cert), "--key", str(pki.alice.key)]
    done = subprocess.run(
        [*mutual, "list-queues"], capture_output=True, timeout=WAIT, env=clean_env()
    )
    assert done.returncode == 0, done.stderr
    refused = subprocess.run(
        [*cli, str(pki.ca), "list-queues"], capture_output=True, timeout=WAIT, env=clean_env()
    )
    assert refused.returncode == 1
    assert b"Traceback" not in refused.stderr


def test_amqp_plain_without_certificate_has_no_external(tls_broker: ThreadBroker, pki: Pki) -> None:
    port = ports(tls_broker)["amqp_tls"]
    params = pika.ConnectionParameters(
        HOST,
        port,
        credentials=pika.credentials.ExternalCredentials(),
        ssl_options=pika.SSLOptions(client_ctx(pki), "localhost"),
        connection_attempts=1,
        socket_timeout=WAIT,
    )
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(params)


# -- bad input: refused with a log line, nobody else affected, nothing lost ---------------------


@pytest.fixture
def guarded(
    make_mqtt_broker: MakeBroker, pki: Pki, mqtt_clients: Clients
) -> Iterator[tuple[ThreadBroker, Paho]]:
    """A broker requiring client certificates, a TLS subscriber that must stay unaffected and
    a stored message that must stay stored."""
    broker = make_mqtt_broker(
        tls=tls_settings(pki, require_client_cert=True, handshake_timeout_s=0.5)
    )
    bystander = tls_paho(mqtt_clients, ports(broker)["mqtt_tls"], pki, pki.alice).connected()
    assert bystander.subscribe(("guard/#", 1)) == [1]
    plain = mqtt_clients.paho(ports(broker)["mqtt"]).connected()
    assert plain.subscribe(("keep/#", 1)) == [1]
    plain.publish("guard/before", b"1", qos=1)
    assert bystander.get().payload == b"1"
    broker.call(lambda b: b.manager.create_queue("kept"))
    broker.call(lambda b: b.manager.publish("kept", "m1", b"stored", {}))
    yield broker, bystander
    plain.publish("guard/after", b"2", qos=1)
    assert bystander.get().payload == b"2"
    assert broker.call(lambda b: b.manager.queues["kept"].message_count) == 1


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the broker closed the socket (reads what is left, bounded)."""
    sock.settimeout(WAIT)
    try:
        for _ in range(100):
            if not sock.recv(65536):
                return True
    except ConnectionResetError:
        return True
    return False


def test_plain_bytes_to_a_tls_port(
    guarded: tuple[ThreadBroker, Paho], broker_log: LogEntries
) -> None:
    broker, _ = guarded
    with socket.create_connection((HOST, ports(broker)["mqtt_tls"]), WAIT) as sock:
        sock.sendall(b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00")  # a plain CONNECT
        assert _closed_by_peer(sock)
    wait_until(lambda: bool(log_events(broker_log, "TLS handshake failed")), "log line")
    assert "WRONG_VERSION_NUMBER" in log_events(broker_log, "TLS handshake failed")[0]["reason"]


@pytest.mark.parametrize("listener", ["vibemq", "mqtt", "amqp"])
def test_tls_hello_to_a_plain_port(
    guarded: tuple[ThreadBroker, Paho], broker_log: LogEntries, pki: Pki, listener: str
) -> None:
    broker, _ = guarded
    ctx = client_ctx(pki, pki.alice)
    with (
        socket.create_connection((HOST, ports(broker)[listener]), WAIT) as raw,
        pytest.raises((ssl.SSLError, OSError)),
    ):
        ctx.wrap_socket(raw, server_hostname="localhost")
    wait_until(lambda: bool(log_events(broker_log, "TLS handshake on a plain port: closed")), "log")


@pytest.mark.parametrize("who", ["expired", "foreign", "none"])
def test_refused_client_certificates(
    guarded: tuple[ThreadBroker, Paho], broker_log: LogEntries, pki: Pki, who: str
) -> None:
    broker, _ = guarded
    issued = {"expired": pki.expired, "foreign": pki.foreign, "none": None}[who]
    ctx = client_ctx(pki, issued)
    # TLS 1.3: the client learns of the refusal at its first read.
    with (
        socket.create_connection((HOST, ports(broker)["amqp_tls"]), WAIT) as raw,
        pytest.raises((ssl.SSLError, OSError)),
    ):
        tls = ctx.wrap_socket(raw, server_hostname="localhost")
        tls.sendall(b"AMQP\0\0\x09\x01")
        assert not tls.recv(1024)
        raise ConnectionResetError("closed")
    wait_until(lambda: bool(log_events(broker_log, "TLS handshake failed")), "log line")
    reason = log_events(broker_log, "TLS handshake failed")[0]["reason"]
    expected = {
        "expired": "certificate has expired",
        "foreign": "unable to get local issuer certificate",
        "none": "PEER_DID_NOT_RETURN_A_CERTIFICATE",
    }[who]
    assert expected in reason


def test_stalled_handshake_times_out(
    guarded: tuple[ThreadBroker, Paho], broker_log: LogEntries
) -> None:
    broker, _ = guarded
    with socket.create_connection((HOST, ports(broker)["vibemq_tls"]), WAIT) as sock:
        assert _closed_by_peer(sock)  # said nothing: dropped after handshake_timeout_s
    assert log_events(broker_log, "TLS handshake timed out")


@pytest.mark.parametrize("version", ["-tls1", "-tls1_1"])
def test_old_tls_versions_refused(
    guarded: tuple[ThreadBroker, Paho], broker_log: LogEntries, pki: Pki, version: str
) -> None:
    broker, _ = guarded
    done = _s_client(
        ports(broker)["mqtt_tls"],
        version,
        "-cipher",
        "DEFAULT@SECLEVEL=0",
        "-cert",
        str(pki.alice.cert),
        "-key",
        str(pki.alice.key),
    )
    assert done.returncode != 0
    out = (done.stdout + done.stderr).decode(errors="replace")
    assert "Cipher is (NONE)" in out or "alert protocol version" in out
    wait_until(lambda: bool(log_events(broker_log, "TLS handshake failed")), "log line")
    assert "UNSUPPORTED_PROTOCOL" in log_events(broker_log, "TLS handshake failed")[0]["reason"]


# -- SIGHUP: new certificates for new connections, the open ones kept -----------------------------


async def test_sighup_reloads_certificates(tmp_path: Path, pki: Pki) -> None:
    cert, key = tmp_path / "live.pem", tmp_path / "live.key"
    shutil.copy(pki.server.cert, cert)
    shutil.copy(pki.server.key, key)
    proc, ready, stderr = await launch(
        tmp_path,
        tmp_path / "data",
        "--tls-cert",
        str(cert),
        "--tls-key",
        str(key),
        "--tls-port",
        "0",
        "--mqtt-tls-port",
        "0",
        "--amqp-tls-port",
        "0",
    )
    try:
        port = ready["vibemq_tls"]
        assert ready["mqtt_tls"] and ready["amqp_tls"]

        async def served_cert() -> bytes:
            _reader, writer = await asyncio.open_connection(
                HOST, port, ssl=client_ctx(pki), server_hostname="localhost"
            )
            der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
            writer.close()
            return bytes(der)

        first = await served_cert()
        async with await Client.connect(HOST, port, ssl_context=client_ctx(pki)) as old:
            await old.create_queue("reload")
            shutil.copy(pki.server2.cert, cert)
            shutil.copy(pki.server2.key, key)
            os.kill(proc.pid, signal.SIGHUP)
            async with asyncio.timeout(WAIT):
                while (now := await served_cert()) == first:
                    await asyncio.sleep(0.05)
            assert ssl.DER_cert_to_PEM_cert(now) == pki.server2.cert.read_text()
            # The connection opened before the reload carries on.
            await old.publish("reload", {"still": "here"})
    finally:
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(WAIT):
            await proc.wait()
        log = (await stderr).decode(errors="replace")
    assert proc.returncode == 0, log
    assert "TLS certificates reloaded" in log


def test_reload_with_a_broken_file_keeps_the_certificate(
    make_mqtt_broker: MakeBroker,
    pki: Pki,
    tmp_path: Path,
    broker_log: LogEntries,
    mqtt_clients: Clients,
) -> None:
    cert, key = tmp_path / "live.pem", tmp_path / "live.key"
    shutil.copy(pki.server.cert, cert)
    shutil.copy(pki.server.key, key)
    broker = make_mqtt_broker(tls=tls_settings(pki, cert_file=cert, key_file=key))
    shutil.copy(pki.server2.cert, cert)  # a new certificate with the old key: unusable
    assert broker.call(lambda b: b.tls is not None and not reload_tls(b.tls, b.config.tls))
    assert log_events(broker_log, "TLS certificates not reloaded, the old ones stay")
    client = tls_paho(mqtt_clients, ports(broker)["mqtt_tls"], pki).connected()
    assert client.subscribe(("still/ok", 0)) == [0]


def test_healthcheck_over_tls(mtls_broker: ThreadBroker, pki: Pki) -> None:
    port = str(ports(mtls_broker)["vibemq_tls"])
    probe = [sys.executable, "-m", "vibemq_server.healthcheck"]
    # A TLS-only deployment: the probe goes to the TLS port by itself.
    env = clean_env(
        VIBEMQ_TLS__PLAIN_VIBEMQ="false",
        VIBEMQ_TLS__PORT=port,
        VIBEMQ_HEALTHCHECK_CERT=str(pki.alice.cert),
        VIBEMQ_HEALTHCHECK_KEY=str(pki.alice.key),
    )
    done = subprocess.run(probe, capture_output=True, timeout=WAIT, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(b"healthy")
    # Without the client certificate this broker wants, it is told so.
    refused = subprocess.run(
        [*probe, "--tls", "--port", port], capture_output=True, timeout=WAIT, env=clean_env()
    )
    assert refused.returncode == 1
    assert refused.stderr.startswith(b"unhealthy")


def test_identity_as_username_without_a_certificate_is_not_authorized(
    make_mqtt_broker: MakeBroker, pki: Pki, mqtt_clients: Clients
) -> None:
    # Certificates asked for but optional: a client without one has no identity to log in as.
    broker = make_mqtt_broker(tls=tls_settings(pki, use_identity_as_username=True))
    port = ports(broker)["mqtt_tls"]
    anonymous = tls_paho(mqtt_clients, port, pki)
    assert anonymous.connect().getName() == "Not authorized"
    assert tls_paho(mqtt_clients, port, pki, pki.alice).connect().getName() == "Success"


def test_min_version_13_refuses_tls_12(
    make_mqtt_broker: MakeBroker, pki: Pki, broker_log: LogEntries
) -> None:
    broker = make_mqtt_broker(tls=tls_settings(pki, min_version="1.3"))
    ctx = client_ctx(pki)
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    with (
        socket.create_connection((HOST, ports(broker)["amqp_tls"]), WAIT) as raw,
        pytest.raises(ssl.SSLError),
    ):
        ctx.wrap_socket(raw, server_hostname="localhost")
    wait_until(lambda: bool(log_events(broker_log, "TLS handshake failed")), "log line")
    assert "UNSUPPORTED_PROTOCOL" in log_events(broker_log, "TLS handshake failed")[0]["reason"]
    ctx13 = client_ctx(pki)
    with (
        socket.create_connection((HOST, ports(broker)["amqp_tls"]), WAIT) as raw,
        ctx13.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        assert tls.version() == "TLSv1.3"
