"""``/api/connections`` and ``/api/consumers``: every client connection across protocols
(``vibemq_server.management.connections``), one in detail, and closing one with a reason
its client is told in its protocol's own words."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request

from vibemq_server.http.auth import log_change
from vibemq_server.http.context import ApiContext, api_context
from vibemq_server.management.connections import (
    DEFAULT_CLOSE_REASON,
    Connection,
    ConnectionDetail,
    ConnectionNotFound,
    Consumer,
    close_connection,
    connection_detail,
    list_connections,
    list_consumers,
)

router = APIRouter(prefix="/api", tags=["connections"])
Ctx = Annotated[ApiContext, Depends(api_context)]
_MISSING: dict[int | str, dict[str, Any]] = {404: {"description": "no such connection"}}


@router.get("/connections", response_model=list[Connection], summary="Every client connection")
async def connections(
    ctx: Ctx, protocol: Annotated[str | None, Query(description="vibemq, mqtt or amqp")] = None
) -> list[Connection]:
    return list_connections(ctx.broker, protocol)


@router.get(
    "/connections/{conn_id}",
    response_model=ConnectionDetail,
    responses=_MISSING,
    summary="One connection, with its consumers and subscriptions",
)
async def connection(ctx: Ctx, conn_id: str) -> ConnectionDetail:
    try:
        return connection_detail(ctx.broker, conn_id)
    except ConnectionNotFound:
        raise HTTPException(404, f"connection '{conn_id}' not found") from None


@router.delete(
    "/connections/{conn_id}",
    response_model=Connection,
    responses=_MISSING,
    summary="Close a connection; its client is told the reason (?reason= or X-Reason, as RabbitMQ)",
)
async def close(
    ctx: Ctx,
    conn_id: str,
    request: Request,
    reason: Annotated[str | None, Query(max_length=200)] = None,
) -> Connection:
    reason = (reason or request.headers.get("x-reason") or DEFAULT_CLOSE_REASON)[:200]
    try:
        closed = close_connection(ctx.broker, conn_id, reason)
    except ConnectionNotFound:
        raise HTTPException(404, f"connection '{conn_id}' not found") from None
    log_change(request.scope, "close connection", conn_id, reason=reason)
    return closed


@router.get("/consumers", response_model=list[Consumer], summary="Every consumer/subscription")
async def consumers(ctx: Ctx, queue: str | None = None) -> list[Consumer]:
    return list_consumers(ctx.broker, queue)
