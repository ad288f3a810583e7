"""Bad input on the HTTP listener: huge and malformed bodies, path traversal on the static
route, oversized headers, a client that sends half a request and stalls (others are served
meanwhile; it is closed with 408), and 3,000 queues listed a page at a time."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from httpkit import HOST, client, raw_request

from vibemq_server.server import Broker

LIMIT = 4096


@pytest.fixture
async def small(broker_factory: Any) -> Broker:
    """A broker whose listener takes bodies of at most LIMIT bytes and gives a request
    half a second to arrive."""
    broker: Broker = await broker_factory(
        http={"port": 0, "tls_port": 0, "max_body_bytes": LIMIT, "request_timeout_s": 0.5}
    )
    return broker


@pytest.fixture
async def small_api(small: Broker) -> AsyncIterator[httpx.AsyncClient]:
    async with client(small) as api:
        yield api


def http_port(broker: Broker) -> int:
    port = broker.ready()["http"]
    assert isinstance(port, int)
    return port


# -- bodies -------------------------------------------------------------------------------------


async def test_a_body_over_the_limit_is_413(small: Broker, small_api: httpx.AsyncClient) -> None:
    huge = {"payload": "x" * (LIMIT * 4)}
    await small_api.put("/api/queues/q")
    r = await small_api.post("/api/queues/q/messages", json=huge)
    assert r.status_code == 413 and str(LIMIT) in r.json()["detail"]
    assert small.manager.queues["q"].message_count == 0

    async def chunks() -> AsyncIterator[bytes]:  # no content-length: counted as it comes
        yield b'{"payload": "'
        for _ in range(LIMIT // 512 + 2):
            yield b"y" * 512
        yield b'"}'

    r = await small_api.post("/api/queues/q/messages", content=chunks())
    assert r.status_code == 413
    assert small.manager.queues["q"].message_count == 0
    # a body under the limit is fine
    assert (await small_api.post("/api/queues/q/messages", json={"payload": 1})).status_code == 201


async def test_a_declared_length_over_the_limit_is_refused_unread(small: Broker) -> None:
    head = (
        f"PUT /api/queues/big HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {10 * 1024 * 1024 * 1024}\r\n\r\n"
    ).encode()
    answer = await raw_request(http_port(small), head + b"{", timeout=10)
    assert answer.startswith(b"HTTP/1.1 413")
    assert "big" not in small.manager.queues


@pytest.mark.parametrize(
    "body",
    [b"{", b"not json at all", b'{"maxQueueSize": }', b"[1, 2, 3]", b'"a string"', b"\xff\xfe"],
)
async def test_malformed_json_is_400(api: httpx.AsyncClient, body: bytes) -> None:
    r = await api.put("/api/queues/m", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["detail"]
    assert (await api.get("/api/queues/m")).status_code == 404


async def test_deeply_nested_json_is_refused_without_harm(api: httpx.AsyncClient) -> None:
    await api.put("/api/queues/deep")
    body = b'{"payload": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    r = await api.post(
        "/api/queues/deep/messages", content=body, headers={"content-type": "application/json"}
    )
    assert r.status_code in (400, 413), r.text
    assert (await api.get("/health/live")).status_code == 200


# -- paths and headers --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/api/static/../app.py",
        "/api/static/../../http/app.py",
        "/api/static/swagger-ui/../../app.py",
        "/api/static/%2e%2e/app.py",
        "/api/static/%2e%2e%2fapp.py",
        "/api/static/swagger-ui/..%2f..%2fapp.py",
        "/api/static/..%5capp.py",
        "/api/static//etc/passwd",
        "/api/static/%2fetc%2fpasswd",
        "/api/static/swagger-ui/%00",
    ],
)
async def test_no_path_traversal_on_the_static_route(broker: Broker, path: str) -> None:
    request = f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
    answer = await raw_request(http_port(broker), request)
    status = answer.split(b"\r\n", 1)[0]
    assert status.split()[1] in (b"400", b"404"), (path, status)
    assert b"create_app" not in answer and b"root:" not in answer


async def test_oversized_headers_are_431(broker: Broker) -> None:
    request = b"GET /health/live HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 100_000
    answer = await raw_request(http_port(broker), request + b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 431") or answer.startswith(b"HTTP/1.1 400")


# -- a slow client ------------------------------------------------------------------------------


async def test_a_stalled_request_blocks_nobody_and_is_closed(
    small: Broker, small_api: httpx.AsyncClient
) -> None:
    reader, writer = await asyncio.open_connection(HOST, http_port(small))
    writer.write(b"GET /api/overview HTTP/1.1\r\nHost: x\r\nX-Half: ")  # ... and nothing more
    await writer.drain()
    idle_reader, idle_writer = await asyncio.open_connection(HOST, http_port(small))
    try:
        # meanwhile every other request is answered
        for _ in range(5):
            assert (await small_api.get("/health/live")).status_code == 200
            assert (await small_api.get("/api/queues")).status_code == 200
        # the stalled request is answered 408 and closed; a silent connection too
        async with asyncio.timeout(10):
            answer = await reader.read(-1)
            idle_answer = await idle_reader.read(-1)
        assert answer.startswith(b"HTTP/1.1 408")
        assert idle_answer.startswith(b"HTTP/1.1 408")
    finally:
        writer.close()
        idle_writer.close()


# -- thousands of queues ------------------------------------------------------------------------


async def test_three_thousand_queues_page_by_page(broker: Broker, api: httpx.AsyncClient) -> None:
    names = [f"q{i:04d}" for i in range(3000)]
    for name in names:
        broker.manager.create_queue(name)
    for i in range(10):  # some depth to sort by
        broker.manager.publish("q0007", f"m{i}", b"1", {}, route=False)
    seen: list[str] = []
    page = 1
    while True:
        r = await api.get("/api/queues", params={"page": page, "pageSize": 250})
        assert r.status_code == 200
        body = r.json()
        assert body["total"] == 3000 and body["pages"] == 12 and body["pageSize"] == 250
        if not body["items"]:
            break
        assert len(body["items"]) == 250
        seen += [q["name"] for q in body["items"]]
        page += 1
        assert page <= 13
    assert seen == names  # every queue once, in name order
    r = await api.get("/api/queues", params={"name": "q29", "pageSize": 1000})
    assert r.json()["total"] == 100
    r = await api.get("/api/queues", params={"regex": "^q000[0-4]$"})
    assert [q["name"] for q in r.json()["items"]] == ["q0000", "q0001", "q0002", "q0003", "q0004"]
    r = await api.get(
        "/api/queues", params={"sort": "messageCount", "order": "desc", "pageSize": 2}
    )
    assert [q["name"] for q in r.json()["items"]] == ["q0007", "q0000"]
    r = await api.get("/api/queues", params={"sort": "name", "order": "desc", "pageSize": 1})
    assert r.json()["items"][0]["name"] == "q2999"
    assert (await api.get("/api/queues", params={"regex": "(unclosed"})).status_code == 400
    too_big = await api.get("/api/queues", params={"pageSize": 5000})
    assert too_big.status_code == 400 and "pageSize" in too_big.json()["detail"]
    bad_sort = await api.get("/api/queues", params={"sort": "password"})
    assert bad_sort.status_code == 400 and "sort" in bad_sort.json()["detail"]


async def test_a_head_sent_slowly_without_end_is_431(broker: Broker) -> None:
    reader, writer = await asyncio.open_connection(HOST, http_port(broker))
    answer = asyncio.ensure_future(reader.read(-1))
    try:
        writer.write(b"GET /health/live HTTP/1.1\r\nHost: x\r\nX-Endless: ")
        for _ in range(200):  # up to 200 KiB of one header value, never finished
            if answer.done():
                break
            writer.write(b"z" * 1024)
            await writer.drain()
            await asyncio.sleep(0.005)  # the broker reads each piece (the same loop)
        async with asyncio.timeout(10):
            assert (await answer).startswith(b"HTTP/1.1 431")
    finally:
        writer.close()
