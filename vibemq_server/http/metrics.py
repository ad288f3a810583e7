"""``GET /metrics``: the Prometheus exposition (``vibemq_server.metrics``), built at scrape
time from the counters the broker keeps (docs/monitoring.md). Open to loopback peers by
default (``http.open_metrics``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Response

from vibemq_server.http.context import ApiContext, api_context
from vibemq_server.metrics import render

router = APIRouter(tags=["metrics"])
Ctx = Annotated[ApiContext, Depends(api_context)]


@router.get(
    "/metrics",
    summary="Prometheus metrics (text format 0.0.4)",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}, "description": "the exposition"}},
)
async def metrics(ctx: Ctx) -> Response:
    body, content_type = render(ctx.broker)
    return Response(body, media_type=content_type)
