"""MQTT over WebSockets from a real browser: a page served by the test loads mqtt.js (the npm
package, installed by the test setup into a cache directory) in headless Chromium
(browserkit), subscribes and publishes through the broker over ws (MQTT 3.1.1 and 5.0) and
wss; paho clients on plain MQTT publish to it and read what it publishes, and the test reads
the page back; a page of an origin the broker does not list is refused (403). A screenshot
of each run goes to tests/artifacts/mqtt-websocket/."""

from __future__ import annotations

import base64
import fcntl
import functools
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from browserkit import ARTIFACTS, Watched, chromium, watched_page
from certs import Pki, make_pki, tls_settings
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from mqttutil import Clients, LogEntries, MakeBroker
from playwright.sync_api import Browser, expect
from waits import wait_until

#: mqtt.js major version the page loads (from the npm registry)
MQTTJS = "mqtt@5"
#: where it is installed once and kept between runs (VIBEMQ_TEST_CACHE overrides)
CACHE = Path(os.environ.get("VIBEMQ_TEST_CACHE", Path.home() / ".cache" / "vibemq-tests"))
SHOTS = ARTIFACTS.parent / "mqtt-websocket"

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>VibeMQ over WebSockets</title>
<link rel="icon" href="data:,">
<style>body{font:16px sans-serif;margin:2em} li{margin:.3em 0} #state{font-weight:bold}</style>
<script src="mqtt.min.js"></script></head>
<body><h1>mqtt.js in Chromium</h1><p>connection: <span id="state">connecting</span></p>
<p id="url"></p><h2>received</h2><ul id="got"></ul>
<script>
const params = new URLSearchParams(location.search);
const url = params.get("url");
document.getElementById("url").textContent = url;
window.received = [];
const version = Number(params.get("v") || "4");
const client = mqtt.connect(url, {
  protocolVersion: version, clientId: "chromium-" + Math.random().toString(16).slice(2),
  reconnectPeriod: 0, connectTimeout: 10000,
});
client.on("connect", () => {
  client.subscribe("browser/in/#", { qos: 1 }, (err) => {
    if (err) { document.getElementById("state").textContent = "subscribe failed"; return; }
    const options = { qos: 1 };
    if (version === 5) options.properties = { userProperties: { from: "chromium" } };
    client.publish("browser/out", "hello from chromium", options, () => {
      document.getElementById("state").textContent = "subscribed";
    });
  });
});
client.on("message", (topic, payload) => {
  const text = topic + ": " + new TextDecoder().decode(payload);
  window.received.push(text);
  const li = document.createElement("li");
  li.textContent = text;
  document.getElementById("got").appendChild(li);
});
client.on("error", (err) => { document.getElementById("state").textContent = "error " + err; });
</script></body></html>
"""


@pytest.fixture(scope="session")
def mqttjs_bundle() -> Path:
    """mqtt.js's browser bundle, from the npm registry: ``npm install`` once into a cache
    (under a lock, into a fresh directory renamed into place when complete, so concurrent or
    interrupted runs never see half an install)."""
    prefix = CACHE / "mqttjs"
    bundle = prefix / "node_modules" / "mqtt" / "dist" / "mqtt.min.js"
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / "mqttjs.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not bundle.exists():
            npm = shutil.which("npm")
            assert npm, "npm is needed for the browser test (scripts/_system.sh installs it)"
            fresh = Path(tempfile.mkdtemp(prefix="mqttjs-", dir=CACHE))
            subprocess.run(
                [npm, "install", "--prefix", str(fresh), "--no-audit", "--no-fund", MQTTJS],
                check=True,
                timeout=300,
                capture_output=True,
            )
            shutil.rmtree(prefix, ignore_errors=True)
            fresh.rename(prefix)
    assert bundle.exists(), f"npm installed no {bundle}"
    return bundle


@pytest.fixture
def site(tmp_path: Path, mqttjs_bundle: Path) -> Iterator[str]:
    """The test page and mqtt.js, served over HTTP on a free loopback port."""
    root = tmp_path / "site"
    root.mkdir()
    (root / "index.html").write_text(PAGE, encoding="utf-8")
    shutil.copy(mqttjs_bundle, root / "mqtt.min.js")
    handler = functools.partial(Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="site", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/index.html"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def round_trip(
    page: Watched, site: str, url: str, clients: Clients, mqtt_port: int, version: int = 4
) -> None:
    """The page subscribes and publishes over ``url`` at MQTT ``version`` (4: 3.1.1, 5:
    5.0, with a user property on its PUBLISH); a plain-MQTT paho client (of the same version)
    gets what it published and publishes to it; the page shows what it got."""
    protocol = mqtt.MQTTv5 if version == 5 else mqtt.MQTTv311
    reader = clients.paho(mqtt_port, protocol=protocol).connected()
    assert reader.subscribe(("browser/out", 1)) == [1]
    page.page.goto(f"{site}?url={url}&v={version}")
    try:
        expect(page.page.locator("#state")).to_have_text("subscribed")
    except AssertionError:
        raise AssertionError(f"{page.console} {page.errors}") from None
    msg = reader.get()
    assert (msg.topic, msg.payload) == ("browser/out", b"hello from chromium")
    if version == 5:
        assert msg.properties is not None
        assert msg.properties.UserProperty == [("from", "chromium")]
    reader.publish("browser/in/greeting", "héllo from paho".encode(), 1)
    reader.publish("browser/in/json", json.dumps({"n": 42}).encode(), 0)
    expect(page.page.locator("#got li")).to_have_count(2)
    assert page.page.evaluate("window.received") == [
        "browser/in/greeting: héllo from paho",
        'browser/in/json: {"n": 42}',
    ]


@pytest.mark.parametrize("version", [4, 5])
def test_mqttjs_in_chromium_over_ws(
    make_mqtt_broker: MakeBroker,
    mqtt_clients: Clients,
    browser: Browser,
    site: str,
    version: int,
) -> None:
    broker = make_mqtt_broker(mqtt={"port": 0, "ws_port": 0})
    port = broker.call(lambda b: b.ready())["mqtt_ws"]
    url = f"ws://127.0.0.1:{port}/mqtt"
    with watched_page(browser) as page:
        round_trip(page, site, url, mqtt_clients, broker.mqtt_port, version)
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.page.screenshot(path=str(SHOTS / f"mqttjs-ws-v{version}.png"), full_page=True)
        page.assert_clean()


@pytest.fixture(scope="module")
def browser(pki: Pki) -> Iterator[Browser]:
    """Chromium that trusts the test's server certificate (by its public key) and no other."""
    cert = x509.load_pem_x509_certificate(pki.server.cert.read_bytes())
    spki = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    digest = base64.b64encode(hashlib.sha256(spki).digest()).decode()
    with chromium(f"--ignore-certificate-errors-spki-list={digest}") as b:
        yield b


def test_mqttjs_in_chromium_over_wss(
    make_mqtt_broker: MakeBroker,
    mqtt_clients: Clients,
    browser: Browser,
    site: str,
    pki: Pki,
) -> None:
    # No tls.ca_file: a server that asks for a client certificate gets its wss handshake
    # cancelled by Chromium unless the browser has one to give (docs/mqtt.md).
    broker = make_mqtt_broker(mqtt={"port": 0, "wss_port": 0}, tls=tls_settings(pki, ca_file=None))
    port = broker.call(lambda b: b.ready())["mqtt_wss"]
    with watched_page(browser) as page:
        round_trip(page, site, f"wss://localhost:{port}/mqtt", mqtt_clients, broker.mqtt_port)
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.page.screenshot(path=str(SHOTS / "mqttjs-wss.png"), full_page=True)
        page.assert_clean()


def test_a_page_of_a_foreign_origin_is_refused(
    make_mqtt_broker: MakeBroker,
    mqtt_clients: Clients,
    browser: Browser,
    site: str,
    broker_log: LogEntries,
) -> None:
    """Chromium sends the page's origin on the upgrade: a page of a site the broker does not
    list gets 403 (mqtt.js never connects); listed exactly, the same page gets through."""
    page_origin = site.rsplit("/", 1)[0]  # http://127.0.0.1:PORT
    refusing = make_mqtt_broker(
        mqtt={"port": 0, "ws_port": 0, "ws_allowed_origins": ["https://app.example.com"]}
    )
    refusing_port = refusing.call(lambda b: b.ready())["mqtt_ws"]
    event = "websocket handshake refused: origin not allowed"
    with watched_page(browser) as page:
        page.page.goto(f"{site}?url=ws://127.0.0.1:{refusing_port}/mqtt&v=5")
        wait_until(lambda: any(e["event"] == event for e in broker_log), "the refusal")
        assert [e["origin"] for e in broker_log if e["event"] == event] == [page_origin]
        expect(page.page.locator("#state")).not_to_have_text("subscribed")
    listed = make_mqtt_broker(mqtt={"port": 0, "ws_port": 0, "ws_allowed_origins": [page_origin]})
    port = listed.call(lambda b: b.ready())["mqtt_ws"]
    with watched_page(browser) as page:
        round_trip(page, site, f"ws://127.0.0.1:{port}/mqtt", mqtt_clients, listed.mqtt_port, 5)
        page.assert_clean()
