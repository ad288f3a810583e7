"""``/api/mqtt``: MQTT sessions (list, detail, end one: its client is disconnected) and
retained messages (list by topic filter, clear one), over
``vibemq_server.management.mqtt``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response

from vibemq_server.http.auth import log_change
from vibemq_server.http.context import ApiContext, api_context
from vibemq_server.management.mqtt import (
    DEFAULT_END_REASON,
    MqttSessionOut,
    RetainedPage,
    SessionPage,
    clear_retained,
    end_session,
    get_session,
    list_retained,
    list_sessions,
)

router = APIRouter(prefix="/api/mqtt", tags=["mqtt"])
Ctx = Annotated[ApiContext, Depends(api_context)]
_NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "not found, or MQTT is off"}}
PageQ = Annotated[int, Query(ge=1)]
PageSizeQ = Annotated[int, Query(ge=1, le=1000, alias="pageSize")]


@router.get("/sessions", response_model=SessionPage, summary="MQTT sessions, a page at a time")
async def sessions(
    ctx: Ctx,
    page: PageQ = 1,
    page_size: PageSizeQ = 100,
    client_id: Annotated[
        str | None, Query(alias="clientId", max_length=256, description="substring")
    ] = None,
    connected: bool | None = None,
) -> SessionPage:
    return list_sessions(
        ctx.broker, page=page, page_size=page_size, client_id=client_id, connected=connected
    )


@router.get(
    "/sessions/{client_id}",
    response_model=MqttSessionOut,
    responses=_NOT_FOUND,
    summary="One MQTT session",
)
async def session(ctx: Ctx, client_id: str) -> MqttSessionOut:
    return get_session(ctx.broker, client_id)


@router.delete(
    "/sessions/{client_id}",
    response_model=MqttSessionOut,
    responses=_NOT_FOUND,
    summary="End a session (a persistent one too): its client is disconnected, without its "
    "will; its subscriptions and queued messages go",
)
async def remove_session(
    ctx: Ctx,
    request: Request,
    client_id: str,
    reason: Annotated[str | None, Query(max_length=200)] = None,
) -> MqttSessionOut:
    ended = end_session(ctx.broker, client_id, reason or DEFAULT_END_REASON)
    log_change(request.scope, "end mqtt session", client_id, connected=ended.connected)
    return ended


@router.get(
    "/retained",
    response_model=RetainedPage,
    summary="Retained messages by topic, of the topics an MQTT filter matches",
)
async def retained(
    ctx: Ctx,
    page: PageQ = 1,
    page_size: PageSizeQ = 100,
    topic_filter: Annotated[
        str | None, Query(alias="filter", max_length=65535, description="e.g. sensors/+/temp")
    ] = None,
) -> RetainedPage:
    return list_retained(ctx.broker, topic_filter, page=page, page_size=page_size)


@router.delete(
    "/retained/{topic:path}",
    status_code=204,
    responses=_NOT_FOUND,
    summary="Clear a topic's retained message",
)
async def remove_retained(ctx: Ctx, request: Request, topic: str) -> Response:
    clear_retained(ctx.broker, topic)
    log_change(request.scope, "clear retained message", topic)
    return Response(status_code=204)
