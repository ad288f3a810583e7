"""``/health/live`` and ``/health/ready``, for Docker and Kubernetes probes.

Live: the event loop answers. Ready: the broker's phase is ``ready`` (journal recovered, every
listener up); 503 while starting and again while draining on SIGTERM, so a load balancer stops
sending clients before the listeners close. Both open without credentials by default
(``http.open_health``), and answer HEAD too (probes that do not want a body)."""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, Depends, Response
from pydantic import BaseModel
from starlette.types import ASGIApp, Receive, Scope, Send

from vibemq_server.http.context import ApiContext, api_context
from vibemq_server.server import Broker, Phase

router = APIRouter(prefix="/health", tags=["health"])
Ctx = Annotated[ApiContext, Depends(api_context)]


class Health(BaseModel):
    status: str
    phase: str


@router.get("/live", response_model=Health, summary="The broker's loop answers")
async def live(ctx: Ctx) -> Health:
    return Health(status="ok", phase=str(ctx.broker.phase))


@router.get(
    "/ready",
    response_model=Health,
    summary="Journal recovered and every listener up (503 while starting or draining)",
    responses={503: {"model": Health, "description": "starting, draining or stopped"}},
)
async def ready(ctx: Ctx, response: Response) -> Health:
    phase = ctx.broker.phase
    if phase is not Phase.READY:
        response.status_code = 503
        return Health(status="unavailable", phase=str(phase))
    return Health(status="ok", phase=str(phase))


# HEAD, for probes that want no body (out of the OpenAPI document: the same operations)
router.add_api_route("/live", live, methods=["HEAD"], include_in_schema=False)
router.add_api_route("/ready", ready, methods=["HEAD"], include_in_schema=False)


class StartingGate:
    """Until the broker is ready (the journal recovers in a worker thread, so the loop
    answers meanwhile), every path but ``/health/*`` gets 503: nothing reads queues that are
    still being rebuilt."""

    def __init__(self, app: ASGIApp, broker: Broker) -> None:
        self.app = app
        self.broker = broker

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and self.broker.phase is Phase.STARTING
            and not scope["path"].startswith("/health")
        ):
            body = json.dumps({"detail": "starting: the journal is being recovered"}).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 503,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        (b"retry-after", b"1"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)
