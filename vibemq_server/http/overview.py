"""``/api/overview``: version, uptime, message rates, connections by protocol, memory and
the journal, in one cheap call (no per-queue detail beyond sums)."""

from __future__ import annotations

import contextlib
import os
import resource
from collections import Counter
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from vibemq_server import __version__
from vibemq_server.core import wall_clock_ms
from vibemq_server.core.manager import iso_ms
from vibemq_server.http.context import ApiContext, api_context
from vibemq_server.http.rates import KEEP
from vibemq_server.server import Broker

router = APIRouter(prefix="/api", tags=["overview"])
Ctx = Annotated[ApiContext, Depends(api_context)]

#: connection id prefix -> protocol (each listener names its connections so)
_PROTOCOLS = {"srv": "vibemq", "mqtt": "mqtt", "amqp": "amqp"}


class Overview(BaseModel):
    version: str
    phase: str
    started_at: str = Field(alias="startedAt")
    uptime_seconds: float = Field(alias="uptimeSeconds")
    listeners: dict[str, int | str | None]
    connections: dict[str, Any]
    queues: dict[str, int]
    rates: dict[str, Any]
    memory: dict[str, Any]
    journal: dict[str, Any]


def connections_by_protocol(broker: Broker) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for conn in broker.connections:
        prefix = str(getattr(conn, "conn_id", "")).split("_", 1)[0]
        counts[_PROTOCOLS.get(prefix, prefix or "other")] += 1
    return dict(counts)


def rss_bytes() -> int:
    """Resident set size now (Linux: /proc), else the peak the kernel reports."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def journal_summary(broker: Broker) -> dict[str, Any]:
    journal = broker.journal
    size = 0
    for seg in list(journal.segments.values()):
        with contextlib.suppress(OSError):
            size += seg.path.stat().st_size
    return {
        "directory": str(journal.directory),
        "fsync": str(journal.policy),
        "available": journal.available,
        "segments": len(journal.segments),
        "activeSegment": journal.active,
        "bytes": size,
        "recoveredMessages": journal.recovered_messages,
    }


@router.get("/overview", response_model=Overview, summary="The broker at a glance")
async def overview(ctx: Ctx) -> dict[str, Any]:
    broker = ctx.broker
    manager = broker.manager
    now = wall_clock_ms()
    ready = unacked = 0
    for queue in manager.queues.values():
        ready += queue.count
        unacked += queue.unacked_count
    by_protocol = connections_by_protocol(broker)
    return {
        "version": __version__,
        "phase": str(broker.phase),
        "startedAt": iso_ms(broker.started_at_ms),
        "uptimeSeconds": round((now - broker.started_at_ms) / 1000, 3),
        "listeners": broker.ready(),
        "connections": {"total": sum(by_protocol.values()), "byProtocol": by_protocol},
        "queues": {"count": len(manager.queues), "ready": ready, "unacked": unacked},
        "rates": {
            "intervalSeconds": ctx.rates.interval,
            "windowSeconds": ctx.rates.interval * (KEEP - 1),
            "current": ctx.rates.current(),
            "series": ctx.rates.series(),
        },
        "memory": {
            "rssBytes": rss_bytes(),
            "readyBytes": manager.memory_bytes,
            "highWatermarkBytes": manager.memory_high,
            "lowWatermarkBytes": manager.memory_low,
            "publishersBlocked": manager.memory_blocked,
        },
        "journal": journal_summary(broker),
    }
