"""``/api/definitions``: the broker's definitions (queues, exchanges, bindings, users with
their hashes, permissions) as one JSON document, and importing one
(``vibemq_server.management.definitions``, RabbitMQ's definitions in spirit)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, HTTPException, Request
from pydantic import ValidationError

from vibemq_server.http.auth import log_change
from vibemq_server.http.context import ApiContext, api_context
from vibemq_server.management.definitions import (
    Definitions,
    ImportReport,
    export_definitions,
    import_definitions,
    parse_definitions,
)

router = APIRouter(prefix="/api/definitions", tags=["definitions"])
Ctx = Annotated[ApiContext, Depends(api_context)]


@router.get("", response_model=Definitions, summary="Export every definition")
async def export(ctx: Ctx) -> Definitions:
    return export_definitions(ctx.broker)


@router.post(
    "",
    response_model=ImportReport,
    responses={400: {"description": "the document does not validate (fields named)"}},
    summary="Import: create what is missing, report conflicts, change nothing that exists",
)
async def import_(
    ctx: Ctx, request: Request, document: Annotated[dict[str, Any], Body()]
) -> ImportReport:
    try:
        parsed = parse_definitions(document)
    except ValidationError as exc:
        fields = [".".join(str(p) for p in err["loc"]) for err in exc.errors()]
        raise HTTPException(400, {"message": "invalid definitions", "fields": fields}) from None
    report = import_definitions(ctx.broker, parsed)
    log_change(request.scope, "import definitions", "definitions")
    return report
