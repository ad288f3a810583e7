"""``/api/users``: the broker's users (``vibemq_server.management.users``): list, detail,
create or update (password, tags), delete, permissions. A password goes in, never out: no
answer and no log line holds a password or a hash."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response, status

from vibemq_server.http.auth import log_change
from vibemq_server.http.context import ApiContext, api_context
from vibemq_server.management.users import (
    PermissionsIn,
    UserIn,
    UserOut,
    delete_user,
    get_user,
    list_users,
    put_user,
    set_permissions,
)

router = APIRouter(prefix="/api/users", tags=["users"])
Ctx = Annotated[ApiContext, Depends(api_context)]
_NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "no such user"}}


@router.get("", response_model=list[UserOut], summary="Users with their tags and permissions")
async def users(ctx: Ctx) -> list[UserOut]:
    return list_users(ctx.broker)


@router.get("/{name}", response_model=UserOut, responses=_NOT_FOUND, summary="One user")
async def user(ctx: Ctx, name: str) -> UserOut:
    return get_user(ctx.broker, name)


@router.put(
    "/{name}",
    response_model=UserOut,
    responses={201: {"description": "created"}},
    summary="Create a user (password needed) or update its password and/or tags "
    "(201 created; 200 updated); in force at once",
)
async def put(ctx: Ctx, request: Request, response: Response, name: str, spec: UserIn) -> UserOut:
    out, created = await put_user(ctx.broker, name, spec)
    changed = [k for k in ("password", "tags") if getattr(spec, k) is not None]
    log_change(request.scope, "create user" if created else "update user", name, changed=changed)
    response.status_code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
    return out


@router.delete("/{name}", status_code=204, responses=_NOT_FOUND, summary="Delete a user")
async def delete(ctx: Ctx, request: Request, name: str) -> Response:
    await delete_user(ctx.broker, name)
    log_change(request.scope, "delete user", name)
    return Response(status_code=204)


@router.put(
    "/{name}/permissions",
    response_model=UserOut,
    responses=_NOT_FOUND,
    summary="Set a user's configure/write/read regular expressions (one left out is kept); "
    "its open connections are judged by them from their next operation",
)
async def permissions(ctx: Ctx, request: Request, name: str, spec: PermissionsIn) -> UserOut:
    out = await set_permissions(ctx.broker, name, spec)
    log_change(request.scope, "set permissions", name, **out.permissions.model_dump())
    return out
