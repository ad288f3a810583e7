"""``/api/exchanges`` and ``/api/bindings``: AMQP exchanges and bindings
(``vibemq_server.management.exchanges``): list, detail, declare, delete; list (by source or
destination), create, delete. The default exchange is ``amq.default`` in a path."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response, status

from vibemq_server.http.auth import log_change
from vibemq_server.http.context import ApiContext, api_context
from vibemq_server.management.errors import Invalid
from vibemq_server.management.exchanges import (
    BindingIn,
    BindingOut,
    DestinationType,
    ExchangeIn,
    ExchangeOut,
    create_binding,
    declare_exchange,
    delete_binding,
    delete_exchange,
    get_exchange,
    list_bindings,
    list_exchanges,
)

router = APIRouter(prefix="/api", tags=["exchanges"])
Ctx = Annotated[ApiContext, Depends(api_context)]
_NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "not found, or AMQP is off"}}


@router.get("/exchanges", response_model=list[ExchangeOut], summary="Every AMQP exchange")
async def exchanges(ctx: Ctx) -> list[ExchangeOut]:
    return list_exchanges(ctx.broker)


@router.get(
    "/exchanges/{name}", response_model=ExchangeOut, responses=_NOT_FOUND, summary="One exchange"
)
async def exchange(ctx: Ctx, name: str) -> ExchangeOut:
    return get_exchange(ctx.broker, name)


@router.put(
    "/exchanges/{name}",
    response_model=ExchangeOut,
    responses={
        201: {"description": "created"},
        403: {"description": "a reserved name (amq.*)"},
        409: {"description": "it exists with other settings"},
    },
    summary="Declare an exchange (201 created; 200 it exists with these settings)",
)
async def put_exchange(
    ctx: Ctx, request: Request, response: Response, name: str, spec: ExchangeIn
) -> ExchangeOut:
    declared, created = declare_exchange(ctx.broker, name, spec)
    if created:
        log_change(request.scope, "declare exchange", name, type=str(spec.type))
    response.status_code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
    return declared


@router.delete(
    "/exchanges/{name}",
    status_code=204,
    responses={**_NOT_FOUND, 409: {"description": "if_unused and it has bindings"}},
    summary="Delete an exchange and its bindings",
)
async def remove_exchange(
    ctx: Ctx,
    request: Request,
    name: str,
    if_unused: Annotated[bool, Query(alias="if-unused")] = False,
) -> Response:
    delete_exchange(ctx.broker, name, if_unused=if_unused)
    log_change(request.scope, "delete exchange", name)
    return Response(status_code=204)


@router.get("/bindings", response_model=list[BindingOut], summary="Bindings, filtered")
async def bindings(
    ctx: Ctx,
    source: Annotated[str | None, Query(description="an exchange")] = None,
    destination: Annotated[str | None, Query(description="a queue or exchange")] = None,
    destination_type: DestinationType | None = None,
) -> list[BindingOut]:
    return list_bindings(ctx.broker, source, destination, destination_type)


@router.post(
    "/bindings",
    response_model=BindingOut,
    status_code=201,
    responses={**_NOT_FOUND, 403: {"description": "the default exchange, a $ queue"}},
    summary="Bind a queue or exchange to an exchange (201 new; 200 it was there)",
)
async def bind(ctx: Ctx, request: Request, response: Response, spec: BindingIn) -> BindingOut:
    binding, created = create_binding(ctx.broker, spec)
    if created:
        log_change(
            request.scope,
            "bind",
            spec.source,
            destination=spec.destination,
            destination_type=spec.destination_type,
            routing_key=spec.routing_key,
        )
    response.status_code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
    return binding


@router.delete(
    "/bindings",
    response_model=BindingOut,
    responses=_NOT_FOUND,
    summary="Remove one binding, named by source, destination, routing key and arguments",
)
async def unbind(
    ctx: Ctx,
    request: Request,
    source: Annotated[str, Query(min_length=1)],
    destination: Annotated[str, Query(min_length=1)],
    destination_type: DestinationType = "queue",
    routing_key: str = "",
    arguments: Annotated[str, Query(description="a JSON object")] = "{}",
) -> BindingOut:
    try:
        table = json.loads(arguments)
    except ValueError:
        raise Invalid("not JSON", "arguments") from None
    if not isinstance(table, dict):
        raise Invalid("a JSON object is needed", "arguments")
    spec = BindingIn(
        source=source,
        destination=destination,
        destination_type=destination_type,
        routing_key=routing_key,
        arguments=table,
    )
    removed = delete_binding(ctx.broker, spec)
    log_change(
        request.scope,
        "unbind",
        source,
        destination=destination,
        destination_type=destination_type,
        routing_key=routing_key,
    )
    return removed
