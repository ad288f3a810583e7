"""A small client of the broker's management HTTP API (docs/management.md), for the
``vibemq`` CLI's operator commands.

The standard library's ``urllib`` rather than httpx: the CLI sends one request at a time and
waits for it, which ``urllib.request`` does with TLS (``ssl`` contexts), and the broker
package keeps no HTTP client among its runtime dependencies for that (httpx stays a test
dependency). Credentials: HTTP basic auth (a user and its password) or a bearer token.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

DEFAULT_HTTP_URL = "http://127.0.0.1:2927"
#: the longest answer read (a definitions export of a large broker fits)
MAX_ANSWER_BYTES = 256 * 1024 * 1024


class ApiError(Exception):
    """The API refused a request (``status``: its HTTP status) or could not be reached
    (``status`` 0)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


_HINTS = {
    401: "check --user and VIBEMQ_PASSWORD, or --token",
    403: "the user's tags do not allow this (administrator or management may change things)",
}


def _detail(raw: bytes) -> str:
    """The API's ``{"detail": ...}``, or the body as it is."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace").strip()
    detail = doc.get("detail") if isinstance(doc, dict) else None
    if isinstance(detail, str):
        return detail
    return json.dumps(detail if detail is not None else doc)


class ApiClient:
    """One broker's API at ``base_url``, as ``user``/``password`` or with ``token``."""

    def __init__(
        self,
        base_url: str,
        *,
        user: str | None = None,
        password: str | None = None,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.ssl_context = ssl_context
        self.headers = {"Accept": "application/json", "User-Agent": "vibemq-cli"}
        if user is not None:
            pair = f"{user}:{password or ''}".encode()
            self.headers["Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
        elif token:
            self.headers["Authorization"] = f"Bearer {token}"

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str | int | None] | None = None,
        body: Any = None,
    ) -> Any:
        """Send one request; the decoded JSON answer (None when it has no body). Raises
        ApiError with the API's own words for a refusal."""
        url = self.base_url + path
        params = {k: str(v) for k, v in (query or {}).items() if v is not None}
        if params:
            url += "?" + urllib.parse.urlencode(params)
        data = None
        headers = dict(self.headers)
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self.ssl_context) as r:
                raw = r.read(MAX_ANSWER_BYTES)
        except urllib.error.HTTPError as exc:
            detail = _detail(exc.read(64 * 1024))
            hint = _HINTS.get(exc.code)
            message = f"{exc.code} {exc.reason}: {detail}" + (f" ({hint})" if hint else "")
            raise ApiError(exc.code, message) from None
        except urllib.error.URLError as exc:
            raise ApiError(0, f"cannot reach {self.base_url}: {exc.reason}") from None
        except (OSError, ValueError) as exc:  # a reset, a timeout, a malformed URL
            raise ApiError(0, f"cannot reach {self.base_url}: {exc}") from None
        return json.loads(raw) if raw else None


def quote(name: str) -> str:
    """A name as one path segment (queue names, connection ids)."""
    return urllib.parse.quote(name, safe="")
