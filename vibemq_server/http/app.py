"""The ASGI app of the HTTP listener: FastAPI, one router per area, offline API docs.

Mount points: each management area is one ``APIRouter`` in a module of its own, listed in
``ROUTERS`` (health, overview, queues, connections, definitions, exchanges, MQTT, users,
/metrics, and the web dashboard's page, whose files are a StaticFiles mount). A router is
thin: the work is in ``vibemq_server.management``, whose refusals (``management.errors``)
are answered here by kind (``REFUSALS``). Every route is
``async def`` (FastAPI runs plain functions on worker threads, and the broker may only be
touched from its loop) and takes its broker through ``Depends(api_context)``. Around the
routes, outermost first: the starting gate (503 until the broker is ready: health.py), the
body bound (limits.py), then authentication and tags (auth.py) -- all before a body is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.types import ASGIApp

from vibemq_server import __version__
from vibemq_server.http import (
    connections,
    dashboard,
    definitions,
    exchanges,
    health,
    metrics,
    mqtt,
    overview,
    queues,
    users,
)
from vibemq_server.http.auth import AuthMiddleware
from vibemq_server.http.context import ApiContext
from vibemq_server.http.limits import BodyLimitMiddleware
from vibemq_server.management.errors import (
    Conflict,
    Forbidden,
    Invalid,
    ManagementError,
    NotFound,
    Unavailable,
)

STATIC = Path(__file__).parent / "static"

#: every area's router, in the order the OpenAPI document lists them
ROUTERS: list[APIRouter] = [
    health.router,
    overview.router,
    queues.router,
    connections.router,
    definitions.router,
    exchanges.router,
    mqtt.router,
    users.router,
    metrics.router,
    dashboard.router,
]

_DESCRIPTION = """Manage and observe a VibeMQ broker (docs/management.md).

Credentials: HTTP basic auth with a broker user, or `Authorization: Bearer <token>`.
Tags: `administrator`/`management` may do everything, `monitoring` may read."""


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    """``("body", "maxQueueSize")`` -> ``maxQueueSize``; ``("query", "page")`` -> ``page``."""
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    return ".".join(parts) or "body"


async def _invalid(request: Request, exc: Exception) -> JSONResponse:
    """A request that does not validate: 400, naming each bad field."""
    assert isinstance(exc, RequestValidationError)
    errors = [
        {"field": _field(err.get("loc", ())), "message": err.get("msg", "invalid")}
        for err in exc.errors()
    ]
    detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors) or "invalid request"
    return JSONResponse({"detail": detail, "errors": errors}, status_code=400)


#: a management refusal's kind -> the status it is answered with
REFUSALS: dict[type[ManagementError], int] = {
    NotFound: 404,
    Invalid: 400,
    Conflict: 409,
    Forbidden: 403,
    Unavailable: 503,
}


async def _refused(request: Request, exc: Exception) -> JSONResponse:
    """A management function said no (vibemq_server.management.errors): its status, and the
    bad field named as a validation error names it."""
    assert isinstance(exc, ManagementError)
    status = next((code for kind, code in REFUSALS.items() if isinstance(exc, kind)), 400)
    if exc.field is None:
        return JSONResponse({"detail": exc.message}, status_code=status)
    detail = f"{exc.field}: {exc.message}"
    errors = [{"field": exc.field, "message": exc.message}]
    return JSONResponse({"detail": detail, "errors": errors}, status_code=status)


async def _crashed(request: Request, exc: Exception) -> JSONResponse:
    """A bug: 500 with a JSON body (uvicorn logs the exception, listener.py routes it)."""
    return JSONResponse({"detail": "internal error (logged)"}, status_code=500)


_ERROR = {"$ref": "#/components/schemas/Error"}
_INVALID = {"$ref": "#/components/schemas/InvalidRequest"}


def _answer(description: str, body: dict[str, str]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": body}}}


def _errors_as_answered(schema: dict[str, Any]) -> None:
    """FastAPI documents 422 for validation; this API answers 400 (``_invalid``), and 401/403
    from the auth middleware: the document says what a client really gets."""
    schemas = schema["components"].setdefault("schemas", {})
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    schemas["Error"] = {
        "type": "object",
        "properties": {"detail": {"type": "string"}},
        "required": ["detail"],
    }
    schemas["InvalidRequest"] = {
        "type": "object",
        "properties": {
            "detail": {"type": "string"},
            "errors": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"field": {"type": "string"}, "message": {"type": "string"}},
                },
            },
        },
        "required": ["detail", "errors"],
    }
    for path, operations in schema.get("paths", {}).items():
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            if responses.pop("422", None) is not None:
                responses["400"] = _answer("invalid request: every bad field named", _INVALID)
            if path.startswith("/api/"):
                responses["401"] = _answer("no or bad credentials (WWW-Authenticate)", _ERROR)
                responses["403"] = _answer("the user's tags do not allow this", _ERROR)


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document, with the two ways to log in (Swagger UI's Authorize button)."""
    if app.openapi_schema is None:
        from fastapi.openapi.utils import get_openapi

        schema = get_openapi(
            title=app.title,
            version=app.version,
            description=app.description,
            routes=app.routes,
            tags=app.openapi_tags,
        )
        components = schema.setdefault("components", {})
        components["securitySchemes"] = {
            "basic": {"type": "http", "scheme": "basic"},
            "bearer": {"type": "http", "scheme": "bearer"},
        }
        schema["security"] = [{"basic": []}, {"bearer": []}]
        _errors_as_answered(schema)
        app.openapi_schema = schema
    return app.openapi_schema


def create_app(ctx: ApiContext) -> ASGIApp:
    """The listener's ASGI app for one broker."""
    app = FastAPI(
        title="VibeMQ management API",
        version=__version__,
        description=_DESCRIPTION,
        openapi_url="/api/openapi.json",
        docs_url=None,  # served below from the bundled Swagger UI, never from a CDN
        redoc_url=None,
    )
    app.state.ctx = ctx
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(ManagementError, _refused)
    app.add_exception_handler(Exception, _crashed)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    for router in ROUTERS:
        app.include_router(router)
    # Swagger UI's folder only: the dashboard's files are served with their own headers
    app.mount("/api/static/swagger-ui", StaticFiles(directory=STATIC / "swagger-ui"), name="static")
    app.mount(dashboard.MOUNT, dashboard.files(), name="dashboard")

    @app.get("/api/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/api/openapi.json",
            title="VibeMQ management API",
            swagger_js_url="/api/static/swagger-ui/swagger-ui-bundle.js",
            swagger_css_url="/api/static/swagger-ui/swagger-ui.css",
            swagger_favicon_url="/api/static/swagger-ui/favicon-32x32.png",
            # no badge fetched from swagger.io: nothing leaves the machine
            swagger_ui_parameters={"validatorUrl": None},
        )

    config = ctx.broker.config.http
    guarded = AuthMiddleware(app, ctx.broker.auth, config)
    return health.StartingGate(BodyLimitMiddleware(guarded, config.max_body_bytes), ctx.broker)
