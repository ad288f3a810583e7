"""Publishing rows into a running broker from one Spark task (no pyspark import).

One connection per call, the project's asyncio client run with ``asyncio.run``, up to
``max_in_flight`` publishes awaiting their PublishAck at once, and every PublishAck awaited
before returning. Any refusal (an ``Error`` reply) or a lost connection raises, so Spark fails
the task and retries it: delivery into the broker is at least once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from vibemq_server.client import Client

PRIORITIES = ("Low", "Normal", "High", "Critical")


def option(options: Mapping[str, str], name: str) -> str | None:
    """Option lookup ignoring case (Spark passes a case-insensitive dict; tests may not)."""
    lowered = name.lower()
    for key, value in options.items():
        if key.lower() == lowered:
            return str(value)
    return None


@dataclass(frozen=True, slots=True)
class PublishConfig:
    host: str = "127.0.0.1"
    port: int = 2925
    queue: str | None = None  # every row into this queue; else the row's ``queue`` column
    token: str | None = None
    max_in_flight: int = 1000
    timeout: float = 30.0  # seconds to wait for one PublishAck

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> PublishConfig:
        return cls(
            host=option(options, "host") or "127.0.0.1",
            port=int(option(options, "port") or 2925),
            queue=option(options, "queue") or None,
            token=option(options, "token") or None,
            max_in_flight=max(1, int(option(options, "maxInFlight") or 1000)),
            timeout=float(option(options, "timeout") or 30.0),
        )


def check_columns(names: Iterable[str], config: PublishConfig) -> None:
    """Refuse a DataFrame the writer cannot publish, before any task runs."""
    cols = set(names)
    if "payload" not in cols and "payload_binary" not in cols:
        raise ValueError("the vibemq writer needs a 'payload' (or 'payload_binary') column")
    if config.queue is None and "queue" not in cols:
        raise ValueError("the vibemq writer needs the 'queue' option or a 'queue' column")


@dataclass(frozen=True, slots=True)
class Outgoing:
    queue: str
    payload: bytes
    headers: dict[str, str]
    priority: str | None


def to_outgoing(row: Mapping[str, Any], config: PublishConfig) -> Outgoing:
    """A row (a mapping of column to value) as a publish."""
    queue = config.queue or row.get("queue")
    if not queue:
        raise ValueError("row without a queue (and no 'queue' option)")
    payload = row.get("payload")
    if payload is None:
        payload = row.get("payload_binary")
    if payload is None:
        payload = b""
    data = payload.encode() if isinstance(payload, str) else bytes(payload)
    headers = {str(k): str(v) for k, v in (row.get("headers") or {}).items() if v is not None}
    priority = row.get("priority")
    if isinstance(priority, int):
        prio: str | None = PRIORITIES[priority] if 0 <= priority < len(PRIORITIES) else None
    else:
        prio = str(priority) if priority else None
    return Outgoing(str(queue), data, headers, prio)


def _as_mapping(row: Any) -> Mapping[str, Any]:
    if isinstance(row, Mapping):
        return row
    as_dict = getattr(row, "asDict", None)  # pyspark.sql.Row
    if as_dict is not None:
        return dict(as_dict())
    raise TypeError(f"cannot publish a row of type {type(row).__name__}")


async def _publish_all(config: PublishConfig, rows: Iterable[Any]) -> int:
    client = await Client.connect(
        config.host,
        config.port,
        token=config.token,
        reconnect=False,
        request_timeout=config.timeout,
        keepalive_interval=None,
    )
    count = 0
    in_flight: set[asyncio.Task[str]] = set()
    try:
        for row in rows:
            out = to_outgoing(_as_mapping(row), config)
            if len(in_flight) >= config.max_in_flight:
                done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()  # raises the refusal or the lost connection
            in_flight.add(
                asyncio.create_task(
                    client.publish(
                        out.queue, out.payload, headers=out.headers, priority=out.priority
                    )
                )
            )
            count += 1
        if in_flight:
            for result in await asyncio.gather(*in_flight, return_exceptions=True):
                if isinstance(result, BaseException):
                    raise result
    finally:
        for task in in_flight:
            task.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.gather(*in_flight, return_exceptions=True)
        await client.close()
    return count


def publish_rows(config: PublishConfig, rows: Iterable[Any]) -> int:
    """Publish every row and wait for every PublishAck; returns how many were published."""
    return asyncio.run(_publish_all(config, rows))
