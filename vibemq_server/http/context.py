"""What the API's routes are given: the broker and the listener's own state."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from vibemq_server.http.rates import RateSampler
from vibemq_server.server import Broker


@dataclass(frozen=True, slots=True)
class ApiContext:
    broker: Broker
    #: the core's totals sampled on a timer (message rates of the overview)
    rates: RateSampler


async def api_context(request: Request) -> ApiContext:
    """The dependency every route takes (async: a plain function would run on a worker
    thread, and the broker is only ever touched from its loop)."""
    ctx = request.app.state.ctx
    assert isinstance(ctx, ApiContext)
    return ctx
