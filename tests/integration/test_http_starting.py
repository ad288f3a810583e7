"""While the broker starts (its journal recovers in a worker thread, the loop free), the HTTP
listener answers every path but ``/health/*`` with 503 and a Retry-After, and
``/health/ready`` with 503: nothing reads queues that are still being rebuilt."""

from __future__ import annotations

from pathlib import Path

import httpx

from vibemq_server.app import create_broker
from vibemq_server.config import Config
from vibemq_server.http.app import create_app
from vibemq_server.http.context import ApiContext
from vibemq_server.http.rates import RateSampler
from vibemq_server.server import Phase


async def test_only_health_answers_while_starting(tmp_path: Path) -> None:
    broker = create_broker(Config(data_dir=tmp_path / "data", port=0))
    ctx = ApiContext(broker, RateSampler(broker.manager, active=lambda: False))
    transport = httpx.ASGITransport(app=create_app(ctx), client=("127.0.0.1", 50000))
    async with httpx.AsyncClient(transport=transport, base_url="http://broker") as api:
        broker.phase = Phase.STARTING
        for path in ("/api/queues", "/api/overview", "/metrics", "/api/connections"):
            r = await api.get(path)
            assert r.status_code == 503, (path, r.text)
            assert r.headers["retry-after"] == "1"
        assert (await api.get("/health/live")).status_code == 200
        ready = await api.get("/health/ready")
        assert ready.status_code == 503 and ready.json()["phase"] == "starting"

        broker.phase = Phase.READY
        assert (await api.get("/api/queues")).status_code == 200
        assert (await api.get("/health/ready")).status_code == 200
