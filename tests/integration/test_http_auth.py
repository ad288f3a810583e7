"""Who may use the HTTP listener: the broker's users by basic auth and its tokens as bearer
tokens, tags for rights (administrator/management: everything, monitoring: reading), 401
with a challenge, 403 without the tag, open health and docs, anonymous loopback access only
while the broker has no credentials. (The log of changes: test_http_process.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from httpkit import base_url, client, write_users

from vibemq_server.server import Broker

TOKEN = "tok-admin-0123456789"
WATCH_TOKEN = "tok-watch-0123456789"


@pytest.fixture
async def secured(broker_factory: Any, tmp_path: Path) -> Broker:
    broker: Broker = await broker_factory(
        users_file=write_users(tmp_path / "users.json"),
        auth_tokens=[f"{TOKEN}:admin", f"{WATCH_TOKEN}:watcher"],
        auth_failure_delay_s=0.0,
    )
    return broker


async def test_no_credentials_is_401_with_a_challenge(secured: Broker) -> None:
    async with client(secured) as anonymous:
        for path in ("/api/overview", "/api/queues", "/api/nowhere"):
            r = await anonymous.get(path)
            assert r.status_code == 401, path
            challenges = r.headers.get_list("www-authenticate")
            assert any(c.startswith("Basic realm=") for c in challenges)
            assert any(c.startswith("Bearer") for c in challenges)
        # no credentials, no body read: a large POST is refused just the same
        assert (await anonymous.put("/api/queues/x", json={"maxQueueSize": 0})).status_code == 401


async def test_bad_credentials_are_401(secured: Broker) -> None:
    url = base_url(secured)
    async with httpx.AsyncClient(base_url=url, auth=("admin", "wrong")) as wrong:
        assert (await wrong.get("/api/overview")).status_code == 401
    async with httpx.AsyncClient(base_url=url, auth=("ghost", "admin-pw")) as ghost:
        assert (await ghost.get("/api/overview")).status_code == 401
    headers = {"Authorization": "Bearer not-a-token"}
    async with httpx.AsyncClient(base_url=url, headers=headers) as bearer:
        assert (await bearer.get("/api/overview")).status_code == 401
    for value in ("Basic !!!notbase64", "Basic " + "bm9jb2xvbg==", "Digest abc", "Bearer"):
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": value}) as odd:
            assert (await odd.get("/api/overview")).status_code == 401, value


@pytest.mark.parametrize("user", ["admin", "manager"])
async def test_administrator_and_management_may_do_everything(secured: Broker, user: str) -> None:
    async with client(secured, user) as api:
        assert (await api.get("/api/overview")).status_code == 200
        assert (await api.put(f"/api/queues/by-{user}")).status_code == 201
        r = await api.post(f"/api/queues/by-{user}/messages", json={"payload": 1})
        assert r.status_code == 201
        assert (await api.delete(f"/api/queues/by-{user}/contents")).status_code == 200
        assert (await api.delete(f"/api/queues/by-{user}")).status_code == 204


async def test_monitoring_reads_only(secured: Broker) -> None:
    async with client(secured, "admin") as admin:
        await admin.put("/api/queues/watched")
    async with client(secured, "watcher") as api:
        assert (await api.get("/api/overview")).status_code == 200
        assert (await api.get("/api/queues")).json()["total"] == 1
        assert (await api.get("/api/queues/watched/messages")).status_code == 200
        for method, path in [
            ("POST", "/api/queues/watched/messages"),
            ("PUT", "/api/queues/other"),
            ("POST", "/api/queues"),
            ("DELETE", "/api/queues/watched"),
            ("DELETE", "/api/queues/watched/contents"),
            ("POST", "/api/queues/watched/move"),
        ]:
            r = await api.request(method, path, json={"payload": 1})
            assert r.status_code == 403, (method, path)
            assert "watcher" in r.json()["detail"]
    assert "watched" in secured.manager.queues and "other" not in secured.manager.queues


async def test_a_user_without_a_tag_is_403(secured: Broker) -> None:
    async with client(secured, "nobody") as api:
        assert (await api.get("/api/overview")).status_code == 403
        assert (await api.get("/api/queues")).status_code == 403


async def test_bearer_tokens_are_bound_to_users(secured: Broker) -> None:
    url = base_url(secured)
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as a:
        assert (await a.put("/api/queues/tokened")).status_code == 201
    headers = {"Authorization": f"Bearer {WATCH_TOKEN}"}
    async with httpx.AsyncClient(base_url=url, headers=headers) as w:
        assert (await w.get("/api/queues/tokened")).status_code == 200
        assert (await w.delete("/api/queues/tokened")).status_code == 403
    # a token in basic auth's password field works as for the protocols
    async with httpx.AsyncClient(base_url=url, auth=("anyone", TOKEN)) as basic:
        assert (await basic.get("/api/overview")).status_code == 200


async def test_health_and_docs_are_open(secured: Broker) -> None:
    async with client(secured) as anonymous:
        assert (await anonymous.get("/health/live")).status_code == 200
        assert (await anonymous.get("/health/ready")).status_code == 200
        docs = await anonymous.get("/api/docs")
        assert docs.status_code == 200
        # offline: every asset from the broker itself, none from a CDN
        assert "/api/static/swagger-ui/swagger-ui-bundle.js" in docs.text
        assert "http://" not in docs.text and "https://" not in docs.text
        assert '"validatorUrl": null' in docs.text
        bundle = await anonymous.get("/api/static/swagger-ui/swagger-ui-bundle.js")
        assert bundle.status_code == 200 and len(bundle.content) > 100_000
        css = await anonymous.get("/api/static/swagger-ui/swagger-ui.css")
        assert css.status_code == 200
        schema = (await anonymous.get("/api/openapi.json")).json()
        assert "/api/queues/{name}" in schema["paths"]
        assert set(schema["components"]["securitySchemes"]) == {"basic", "bearer"}
        assert "maxQueueSize" in str(schema["components"]["schemas"]["QueueOptionsIn"])
        # the errors documented are the ones answered: 400 (not FastAPI's 422), 401, 403
        put = schema["paths"]["/api/queues/{name}"]["put"]["responses"]
        assert {"400", "401", "403"} <= set(put) and "422" not in str(schema["paths"])


async def test_health_can_be_closed(broker_factory: Any, tmp_path: Path) -> None:
    broker: Broker = await broker_factory(
        users_file=write_users(tmp_path / "users.json"),
        http={"port": 0, "tls_port": 0, "open_health": False},
    )
    async with client(broker) as anonymous:
        assert (await anonymous.get("/health/ready")).status_code == 401
    async with client(broker, "watcher") as watcher:
        assert (await watcher.get("/health/ready")).status_code == 200


async def test_anonymous_only_while_no_credentials_exist(broker_factory: Any) -> None:
    open_broker: Broker = await broker_factory()
    async with client(open_broker) as anonymous:
        assert (await anonymous.put("/api/queues/anon")).status_code == 201
    closed: Broker = await broker_factory(allow_anonymous=False)
    async with client(closed) as anonymous:
        assert (await anonymous.get("/api/overview")).status_code == 401
