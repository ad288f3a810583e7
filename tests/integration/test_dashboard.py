"""The web dashboard in a real headless Chromium (browserkit.py) against a real broker on its
own thread (port 0): the overview, creating a queue, publishing from the form, the depth
changing without a reload, browsing a message (its JSON pretty-printed, its headers), purge,
the dead-letter view's send back, closing a real client's connection, the login form, a
phone's viewport, and thousands of queues a page at a time. Every page must run without a
console error; screenshots are kept in tests/artifacts/dashboard/.

Waits are Playwright's bounded ones (browserkit.WAIT_MS), never a measured time.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from browserkit import DESKTOP, PHONE, WAIT_MS, Watched, chromium, watched_page
from httpkit import TAGGED_USERS, write_users
from mqttutil import Clients, MakeBroker, ThreadBroker
from playwright.sync_api import Browser, Route, expect
from waits import wait_until

from vibemq_server.server import Broker

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as launched:
        yield launched


@pytest.fixture
def desktop(browser: Browser) -> Iterator[Watched]:
    with watched_page(browser, DESKTOP) as page:
        yield page


def base(broker: ThreadBroker) -> str:
    assert broker.broker is not None
    port = broker.broker.ready()["http"]
    assert isinstance(port, int)
    return f"http://127.0.0.1:{port}"


def api(broker: ThreadBroker) -> httpx.Client:
    """The API as an outsider (another operator, a script) uses it meanwhile."""
    return httpx.Client(base_url=base(broker), timeout=10.0)


def ready_count(broker: ThreadBroker, queue: str) -> int:
    return broker.call(lambda b: b.manager.queues[queue].message_count)


# -- the main path -------------------------------------------------------------------------------


def test_overview_create_publish_browse_purge(
    make_mqtt_broker: MakeBroker, desktop: Watched
) -> None:
    broker = make_mqtt_broker()
    page = desktop.page
    page.goto(base(broker) + "/")
    expect(page.locator("#stat-ready .stat-value")).to_have_text("0")
    expect(page.locator("#chart-rates canvas")).to_have_count(1)
    # a mark on the window: it is gone if anything reloads the page
    page.evaluate("window.__loaded_once = true")

    # create a queue from the Queues view
    page.click("#nav a[data-view=queues]")
    page.click("#new-queue")
    page.fill("#new-queue-name", "orders")
    page.select_option("#new-queue-mode", "RoundRobin")
    page.fill("#new-queue-size", "500")
    page.check("#new-queue-dlq")
    page.click("#new-queue-submit")
    expect(page.locator("#banner")).to_contain_text("Queue orders created")
    row = page.locator("#queues tr[data-queue=orders]")
    expect(row).to_be_visible()
    assert broker.call(lambda b: b.manager.queues["orders"].options.max_queue_size) == 500

    # publish from the Publish view's form
    page.click("#nav a[data-view=publish]")
    page.fill("#publish-queue", "orders")
    page.fill("#publish-payload", '{"order": 7, "items": [{"sku": "A-1", "qty": 2}]}')
    page.fill("#publish-headers", '{"source": "e2e"}')
    page.select_option("#publish-priority", "high")
    page.click("#publish-submit")
    expect(page.locator("#publish-result")).to_contain_text("Published")
    assert ready_count(broker, "orders") == 1

    # the list shows the depth; a publish from elsewhere shows up without a click or reload
    page.click("#nav a[data-view=queues]")
    ready_cell = page.locator("#queues tr[data-queue=orders] td").nth(1)
    expect(ready_cell).to_have_text("1")
    with api(broker) as outsider:
        sent = outsider.post("/api/queues/orders/messages", json={"payload": {"order": 8}})
        assert sent.status_code == 201, sent.text
    expect(ready_cell).to_have_text("2")
    # and so does the overview's total
    page.click("#nav a[data-view=overview]")
    expect(page.locator("#stat-ready .stat-value")).to_have_text("2")
    expect(page.locator("#deepest")).to_contain_text("orders")
    desktop.shot("desktop-overview")

    # the queue's page: browse, JSON pretty-printed with its headers
    page.click("#deepest a:text-is('orders')")
    expect(page.locator("h1.queue-name")).to_have_text("orders")
    expect(page.locator("#queue-ready .stat-value")).to_have_text("2")
    first = page.locator("#messages article.message").first
    expect(first.locator("pre.payload")).to_have_text(
        json.dumps({"order": 7, "items": [{"sku": "A-1", "qty": 2}]}, indent=2)
    )
    expect(first.locator("table.headers")).to_contain_text("source")
    expect(first.locator("table.headers")).to_contain_text("e2e")
    expect(first.locator(".badge").first).to_have_text("high")
    desktop.shot("desktop-queue-detail")

    # publish from the queue's own form; the count follows
    page.click("#publish-here summary")
    page.fill("#publish-payload", '"plain JSON string"')
    page.click("#publish-submit")
    expect(page.locator("#queue-ready .stat-value")).to_have_text("3")
    expect(page.locator("#messages article.message")).to_have_count(3)

    # purge: asks once more, then empties the queue
    page.click("#purge")
    expect(page.locator("#purge")).to_have_text("Purge all ready messages?")
    assert ready_count(broker, "orders") == 3
    page.click("#purge")
    expect(page.locator("#banner")).to_contain_text("Purged 3 message(s)")
    expect(page.locator("#queue-ready .stat-value")).to_have_text("0")
    expect(page.locator("#messages")).to_contain_text("No ready messages.")
    assert ready_count(broker, "orders") == 0

    assert page.evaluate("window.__loaded_once") is True, "the page reloaded"
    desktop.assert_clean()


def test_payloads_and_headers_are_shown_never_run(
    make_mqtt_broker: MakeBroker, desktop: Watched
) -> None:
    broker = make_mqtt_broker()
    with api(broker) as outsider:
        assert outsider.put("/api/queues/xss").status_code == 201
        hostile = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'
        for body in (
            {"payload": {"html": hostile}, "headers": {"h<b>": hostile}},
            {"payload": hostile, "payloadEncoding": "text"},
        ):
            assert outsider.post("/api/queues/xss/messages", json=body).status_code == 201
    page = desktop.page
    page.goto(base(broker) + "/#/queues/xss")
    expect(page.locator("#messages article.message")).to_have_count(2)
    expect(page.locator("#messages")).to_contain_text(hostile)
    expect(page.locator("#messages table.headers th").first).to_have_text("h<b>")
    assert page.locator("#messages img, #messages script, #messages b").count() == 0
    assert page.evaluate("window.__xss") is None
    desktop.assert_clean()


def test_mistakes_are_told_plainly(make_mqtt_broker: MakeBroker, desktop: Watched) -> None:
    broker = make_mqtt_broker()
    page = desktop.page
    page.goto(base(broker) + "/#/publish")
    # not JSON: said before anything is sent
    page.fill("#publish-queue", "orders")
    page.fill("#publish-payload", "{not json")
    page.click("#publish-submit")
    expect(page.locator("#banner.error")).to_contain_text("Payload: not JSON")
    page.fill("#publish-payload", "{}")
    page.fill("#publish-headers", '{"n": 1}')
    page.click("#publish-submit")
    expect(page.locator("#banner.error")).to_contain_text('the value of "n" must be a string')
    assert not desktop.console  # no request went out
    # a queue that does not exist: the API's answer, in words
    page.fill("#publish-headers", "")
    page.click("#publish-submit")
    expect(page.locator("#banner.error")).to_contain_text("404: queue 'orders' not found")
    # a queue's page for a queue that is not there
    page.goto(base(broker) + "/#/queues/orders")
    expect(page.locator("#queue-missing")).to_be_visible()
    assert all("404" in line for line in desktop.console), desktop.console
    assert not desktop.errors, desktop.errors


def test_dead_letters_are_sent_back(make_mqtt_broker: MakeBroker, desktop: Watched) -> None:
    broker = make_mqtt_broker()
    with api(broker) as outsider:
        for name in ("orders", "orders.dlq", "invoices"):
            assert outsider.put(f"/api/queues/{name}").status_code == 201
        dead = {"originalQueue": "orders", "deadLetterReason": "MaxRetriesExceeded"}
        for n in range(2):
            sent = outsider.post(
                "/api/queues/orders.dlq/messages", json={"payload": {"n": n}, "headers": dead}
            )
            assert sent.status_code == 201
    page = desktop.page
    page.goto(base(broker) + "/#/dead-letters")
    table = page.locator("#dlq-table")
    expect(table).to_contain_text("orders.dlq")
    expect(table).not_to_contain_text("invoices")
    desktop.shot("desktop-dead-letters")
    button = table.locator("button:text-is('Send back')")
    button.click()
    table.locator("button:text-is('Send all back?')").click()
    expect(page.locator("#banner")).to_contain_text("Sent back 2 message(s) from orders.dlq")
    expect(table).to_contain_text("empty")
    assert ready_count(broker, "orders") == 2
    assert ready_count(broker, "orders.dlq") == 0
    desktop.assert_clean()


def test_a_dead_letter_queue_page_sends_back_too(
    make_mqtt_broker: MakeBroker, desktop: Watched
) -> None:
    """A queue not named like a DLQ whose messages carry originalQueue gets the button."""
    broker = make_mqtt_broker()
    with api(broker) as outsider:
        for name in ("orders", "parked"):
            assert outsider.put(f"/api/queues/{name}").status_code == 201
        sent = outsider.post(
            "/api/queues/parked/messages",
            json={"payload": {"n": 1}, "headers": {"originalQueue": "orders"}},
        )
        assert sent.status_code == 201
    page = desktop.page
    page.goto(base(broker) + "/#/queues/parked")
    expect(page.locator("#messages table.headers")).to_contain_text("originalQueue")
    page.click("button:text-is('Send back')")
    page.click("button:text-is('Send all back?')")
    expect(page.locator("#banner")).to_contain_text("Sent back 1 message(s): 1 to orders")
    assert ready_count(broker, "orders") == 1
    desktop.assert_clean()


# -- connections -------------------------------------------------------------------------------


def test_close_a_real_clients_connection(
    make_mqtt_broker: MakeBroker, mqtt_clients: Clients, desktop: Watched
) -> None:
    broker = make_mqtt_broker()
    paho = mqtt_clients.paho(broker.mqtt_port, "dashboard-victim").connected()
    bystander = mqtt_clients.paho(broker.mqtt_port, "dashboard-bystander").connected()
    page = desktop.page
    page.goto(base(broker) + "/#/connections")
    row = page.locator("#connection-table tr", has_text="dashboard-victim")
    expect(row).to_be_visible()
    expect(page.locator("#connection-table")).to_contain_text("dashboard-bystander")
    desktop.shot("desktop-connections")
    row.locator("button:text-is('Close')").click()
    row.locator("input.reason").fill("maintenance window")
    row.locator("button:text-is('Close it')").click()
    expect(page.locator("#banner")).to_contain_text("closed")
    expect(page.locator("#connection-table")).not_to_contain_text("dashboard-victim")
    expect(page.locator("#connection-table")).to_contain_text("dashboard-bystander")
    paho.disconnects.get(timeout=WAIT_MS / 1000)  # the client saw its connection end
    assert bystander.disconnects.empty()
    desktop.assert_clean()


# -- users and login -----------------------------------------------------------------------------


def test_users_are_listed_or_their_absence_said(
    make_mqtt_broker: MakeBroker, desktop: Watched, tmp_path: Path
) -> None:
    """With /api/users served, its users are listed (read-only); a broker without it says so,
    without a failing request (the page looks the path up in the OpenAPI document)."""
    broker = make_mqtt_broker(users_file=write_users(tmp_path / "users.json"))
    with api(broker) as outsider:
        listed = outsider.get("/api/users", auth=("admin", TAGGED_USERS["admin"][0]))
    assert listed.status_code in (200, 404)
    page = desktop.page
    page.goto(base(broker) + "/")
    page.fill("#login-user", "admin")
    page.fill("#login-password", TAGGED_USERS["admin"][0])
    page.click("#login-form button[type=submit]")
    expect(page.locator("#who")).to_have_text("admin")
    page.click("#nav a[data-view=users]")
    if listed.status_code == 200:
        table = page.locator("#user-table table")
        expect(table).to_contain_text("watcher")
        expect(table).to_contain_text("monitoring")
    else:
        expect(page.locator("#users-missing")).to_be_visible()
    desktop.shot("desktop-users")
    # the one complaint: the 401 that brought up the login form
    assert len(desktop.console) == 1 and "401" in desktop.console[0], desktop.console
    assert not desktop.errors, desktop.errors


def test_login_form_sends_basic_auth(
    make_mqtt_broker: MakeBroker, desktop: Watched, tmp_path: Path
) -> None:
    broker = make_mqtt_broker(users_file=write_users(tmp_path / "users.json"))
    page = desktop.page
    page.goto(base(broker) + "/")
    # the page is open, its data is not: the page asks with its own form (no browser prompt)
    expect(page.locator("#login-form")).to_be_visible()
    page.fill("#login-user", "admin")
    page.fill("#login-password", "wrong")
    page.click("#login-form button[type=submit]")
    expect(page.locator("#login-form .error-text")).to_have_text("Wrong user name or password.")
    desktop.shot("desktop-login")
    page.fill("#login-password", TAGGED_USERS["admin"][0])
    page.click("#login-form button[type=submit]")
    expect(page.locator("#login")).to_have_count(0)
    expect(page.locator("#stat-ready .stat-value")).to_have_text("0")
    expect(page.locator("#who")).to_have_text("admin")
    # the login holds for this tab across a reload; logging out asks again
    page.reload()
    expect(page.locator("#stat-ready .stat-value")).to_have_text("0")
    page.click("#logout")
    expect(page.locator("#login-form")).to_be_visible()
    # The 401s answered to the page's own calls are the browser's "failed to load" lines:
    # expected here, and nothing else.
    assert all("401" in line for line in desktop.console), desktop.console
    assert not desktop.errors, desktop.errors


def test_a_monitoring_user_is_told_it_may_not_purge(
    make_mqtt_broker: MakeBroker, desktop: Watched, tmp_path: Path
) -> None:
    broker = make_mqtt_broker(users_file=write_users(tmp_path / "users.json"))
    broker.call(lambda b: b.manager.create_queue("orders", b.manager.options_from({})))
    page = desktop.page
    page.goto(base(broker) + "/#/queues/orders")
    page.fill("#login-user", "watcher")
    page.fill("#login-password", TAGGED_USERS["watcher"][0])
    page.click("#login-form button[type=submit]")
    expect(page.locator("h1.queue-name")).to_have_text("orders")
    page.click("#purge")
    page.click("#purge")
    expect(page.locator("#banner.error")).to_contain_text("403")
    assert all("401" in line or "403" in line for line in desktop.console), desktop.console
    assert not desktop.errors, desktop.errors


# -- polling: bounded, paused while hidden, backing off --------------------------------------

#: counts the page's fetches and how many were in flight at once (installed before its script)
FETCH_COUNTER = """
window.__fetches = [];
window.__inflight = 0;
window.__maxInflight = 0;
const realFetch = window.fetch.bind(window);
window.fetch = (url, init) => {
  window.__fetches.push(String(url));
  window.__inflight++;
  window.__maxInflight = Math.max(window.__maxInflight, window.__inflight);
  return realFetch(url, init).finally(() => { window.__inflight--; });
};
"""


def test_polling_is_one_at_a_time_paused_when_hidden_and_backs_off(
    make_mqtt_broker: MakeBroker, desktop: Watched
) -> None:
    """With the page's clock faked (Playwright's clock), timers fire only when the test
    advances time: what the poller asks, and when, is exact."""
    broker = make_mqtt_broker()
    page = desktop.page
    page.add_init_script(FETCH_COUNTER)
    start = dt.datetime(2027, 1, 1, tzinfo=dt.UTC)
    page.clock.install(time=start)
    # from here on, the page's time moves only when the test says
    page.clock.pause_at(start + dt.timedelta(seconds=1))
    page.goto(base(broker) + "/")
    expect(page.locator("#stat-ready .stat-value")).to_have_text("0")

    def overview_calls() -> int:
        calls = page.evaluate("window.__fetches.filter(u => u.includes('/api/overview')).length")
        assert isinstance(calls, int)
        return calls

    def settled() -> None:
        # no call in flight and the refresh over (one refresh may make several calls)
        page.wait_for_function(
            "() => window.__inflight === 0 && document.body.dataset.polling !== '1'", polling=50
        )

    settled()
    assert overview_calls() == 1
    # the next refresh 3 s after the last one was answered, not before
    page.clock.run_for(2900)
    assert overview_calls() == 1
    page.clock.run_for(200)
    assert overview_calls() == 2
    settled()

    # hidden: nothing at all, however long; shown again: at once
    page.evaluate(
        "Object.defineProperty(document, 'hidden', {value: true, configurable: true});"
        "document.dispatchEvent(new Event('visibilitychange'))"
    )
    expect(page.locator("#live.idle")).to_be_visible()
    page.clock.run_for(600_000)
    assert overview_calls() == 2
    page.evaluate(
        "Object.defineProperty(document, 'hidden', {value: false, configurable: true});"
        "document.dispatchEvent(new Event('visibilitychange'))"
    )
    assert overview_calls() == 3
    settled()

    # failing: shown, and asked again after 6 s, then 12 s (doubling), not every 3 s
    page.route("**/api/overview", lambda route: route.abort())
    page.clock.run_for(3000)
    assert overview_calls() == 4
    settled()
    expect(page.locator("#banner.error")).to_contain_text("did not answer")
    expect(page.locator("#live.error")).to_be_visible()
    page.clock.run_for(5900)
    assert overview_calls() == 4
    page.clock.run_for(200)
    assert overview_calls() == 5
    settled()
    page.clock.run_for(11_800)
    assert overview_calls() == 5
    page.unroute("**/api/overview")
    page.clock.run_for(300)
    assert overview_calls() == 6
    # answered again: the error goes, the dot is green
    expect(page.locator("#live.ok")).to_be_visible()
    expect(page.locator("#banner")).to_be_hidden()
    settled()

    # a slow answer (1 s of the page's time): the next refresh waits 20 times as long
    held: list[Route] = []
    page.route("**/api/overview", lambda route: held.append(route))
    page.clock.run_for(3000)
    assert overview_calls() == 7
    wait_until(lambda: page.evaluate("1") == 1 and bool(held), "the request held")
    page.clock.run_for(1000)
    held[0].continue_()
    settled()
    page.unroute("**/api/overview")
    page.clock.run_for(19_000)
    assert overview_calls() == 7
    page.clock.run_for(1_100)
    assert overview_calls() == 8

    assert page.evaluate("window.__maxInflight") == 1
    # the only complaints: the two refused requests
    assert len(desktop.console) == 2, desktop.console
    assert all("ERR_FAILED" in line for line in desktop.console), desktop.console
    assert not desktop.errors, desktop.errors


# -- a phone -------------------------------------------------------------------------------------

VIEWS = ["", "queues", "queues/orders", "dead-letters", "publish", "connections", "users"]


def test_every_view_fits_a_phone(
    make_mqtt_broker: MakeBroker, mqtt_clients: Clients, browser: Browser
) -> None:
    broker = make_mqtt_broker()
    mqtt_clients.paho(broker.mqtt_port, "a-phone-sized-client-id").connected()
    with api(broker) as outsider:
        for name in ("orders", "orders.dlq"):
            assert outsider.put(f"/api/queues/{name}").status_code == 201
        long_line = {"text": "a-very-long-unbroken-value-" * 12, "nested": {"list": [1, 2, 3]}}
        body = {"payload": long_line, "headers": {"source": "phone-test"}}
        assert outsider.post("/api/queues/orders/messages", json=body).status_code == 201
    with watched_page(browser, PHONE) as phone:
        page = phone.page
        for view in VIEWS:
            page.goto(f"{base(broker)}/#/{view}")
            expect(page.locator("#live.ok")).to_be_visible()
            expect(page.locator("main h1")).to_be_visible()
            assert phone.overflow_x() <= 0, f"#/{view} is wider than the phone"
            phone.shot("phone-" + (view.replace("/", "-") or "overview"))
        phone.assert_clean()


# -- thousands of queues -------------------------------------------------------------------------


def test_thousands_of_queues_a_page_at_a_time(
    make_mqtt_broker: MakeBroker, desktop: Watched
) -> None:
    broker = make_mqtt_broker()

    def make_many(b: Broker) -> int:
        options = b.manager.options_from({})
        for n in range(3000):
            b.manager.create_queue(f"q-{n:05d}", options)
        return len(b.manager.queues)

    assert broker.call(make_many) >= 3000
    page = desktop.page
    asked: list[str] = []
    page.on("request", lambda r: asked.append(r.url) if "/api/queues" in r.url else None)
    page.goto(base(broker) + "/#/queues")
    expect(page.locator("#page-info")).to_have_text("Page 1 of 60 · 3,000 queues")
    expect(page.locator("#queues tbody tr")).to_have_count(50)
    expect(page.locator("#queues tbody tr").first).to_have_attribute("data-queue", "q-00000")
    listed = [url for url in asked if "/api/queues?" in url]
    assert listed and all("pageSize=50" in url for url in listed), listed
    page.click("#page-next")
    expect(page.locator("#page-info")).to_have_text("Page 2 of 60 · 3,000 queues")
    expect(page.locator("#queues tbody tr").first).to_have_attribute("data-queue", "q-00050")
    # sort by depth and filter, on the server
    page.click("button[data-sort=messageCount]")
    expect(page.locator("th[aria-sort=descending]")).to_have_text("Ready ▼")
    page.fill("#queue-filter", "q-0299")
    expect(page.locator("#page-info")).to_have_text("Page 1 of 1 · 10 queues")
    expect(page.locator("#queues tbody tr")).to_have_count(10)
    desktop.shot("desktop-queues-3000")
    assert all("pageSize=50" in url for url in asked if "/api/queues?" in url)
    desktop.assert_clean()
