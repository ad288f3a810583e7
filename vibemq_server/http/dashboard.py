"""The web dashboard: ``GET /`` answers its page, ``/dashboard/...`` its scripts, styles and
the vendored chart library (uPlot, MIT), all files committed under ``static/dashboard/``: no
Node build at install time.

The page and its files hold no broker data, so they are open like the API's docs
(auth.py); every figure the page shows comes from ``/api/...`` calls made by its script, with
the API's own credentials and tags. The page's Content-Security-Policy allows scripts, styles
and connections to this origin only: data the script inserts can never run.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles
from starlette.types import Scope

#: the dashboard's files: index.html, app.js, app.css, vendor/ (uPlot and its licence)
ROOT = Path(__file__).parent / "static" / "dashboard"
#: where the files are served (a StaticFiles mount: it refuses paths out of ROOT)
MOUNT = "/dashboard"

#: no inline script or style, nothing from another origin, never in a frame
POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
HEADERS = {
    "content-security-policy": POLICY,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    # a new broker version ships new files: the page is checked on every load
    "cache-control": "no-cache",
}

router = APIRouter(tags=["dashboard"])


@router.get("/", include_in_schema=False)
async def index() -> Response:
    """The dashboard's one page (its views are routed in the browser: ``#/queues``, ...)."""
    return Response(_page(), media_type="text/html", headers=HEADERS)


@functools.cache
def _page() -> bytes:
    return (ROOT / "index.html").read_bytes()


class DashboardFiles(StaticFiles):
    """StaticFiles with the page's security headers on every file."""

    def file_response(
        self,
        full_path: str | os.PathLike[str],
        stat_result: os.stat_result,
        scope: Scope,
        status_code: int = 200,
    ) -> Response:
        response = super().file_response(full_path, stat_result, scope, status_code)
        response.headers.update(HEADERS)
        return response


def files() -> StaticFiles:
    return DashboardFiles(directory=ROOT)
