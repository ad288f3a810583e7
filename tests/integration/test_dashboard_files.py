"""The dashboard's page and files over plain HTTP: open without credentials (no broker data in
them) while the API they call is not, their security headers, and no way out of the files'
folder (path traversal)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from httpkit import client, raw_request, write_users

from vibemq_server.server import Broker

BrokerFactory = Callable[..., Awaitable[Broker]]

ASSETS = ("app.js", "app.css", "favicon.svg", "vendor/uPlot.iife.min.js", "vendor/uPlot.LICENSE")


async def test_the_page_is_open_its_data_is_not(
    broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    broker = await broker_factory(users_file=write_users(tmp_path / "users.json"))
    async with client(broker) as anyone:
        page = await anyone.get("/")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        policy = page.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assert "/dashboard/app.js" in page.text
        for asset in ASSETS:
            answer = await anyone.get(f"/dashboard/{asset}")
            assert answer.status_code == 200, asset
            assert answer.headers["x-content-type-options"] == "nosniff"
        assert (await anyone.get("/api/overview")).status_code == 401
        assert (await anyone.get("/dashboard/missing.js")).status_code == 404
        assert (await anyone.get("/dashboard/")).status_code == 404  # no directory listing
        # served in one place only, always with the page's headers
        assert (await anyone.get("/api/static/dashboard/index.html")).status_code == 404
        assert (await anyone.get("/api/static/swagger-ui/swagger-ui.css")).status_code == 200
    async with client(broker, "admin") as admin:
        assert (await admin.get("/api/overview")).status_code == 200
        # the page is no API operation
        doc = (await admin.get("/api/openapi.json")).json()
        assert "/" not in doc["paths"]


@pytest.mark.parametrize(
    "path",
    [
        "/dashboard/../app.py",
        "/dashboard/../../http/dashboard.py",
        "/dashboard/vendor/../../../app.py",
        "/dashboard/%2e%2e/dashboard.py",
        "/dashboard/%2e%2e%2f%2e%2e%2fapp.py",
        "/dashboard/vendor/..%2f..%2f..%2fapp.py",
        "/dashboard/..%5c..%5capp.py",
        "/dashboard//etc/passwd",
        "/dashboard/%2fetc%2fpasswd",
        "/dashboard/%00",
        "/dashboard/app.js%00.py",
        "/%2e%2e/app.py",
    ],
)
async def test_no_path_traversal_out_of_the_dashboard(broker: Broker, path: str) -> None:
    port = broker.ready()["http"]
    assert isinstance(port, int)
    request = f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
    answer = await raw_request(port, request)
    status = answer.split(b"\r\n", 1)[0]
    assert status.split()[1] in (b"400", b"404"), (path, status)
    assert b"create_app" not in answer and b"root:" not in answer and b"ROOT =" not in answer
