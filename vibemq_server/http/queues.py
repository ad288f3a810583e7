"""``/api/queues``: list (paging, filter, sort), detail, create, delete, purge, browse,
publish a test message, move messages (a dead-letter queue back to where they came from).

Every operation goes through the core's ``QueueManager``; names starting with ``$`` belong to
adapters (their durable state): listed and browsable, never changed here.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import uuid
from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response, status

from vibemq_server.core import (
    CoreError,
    InvalidQueueOptions,
    PersistenceUnavailable,
    Priority,
    PublishOutcome,
    Queue,
    QueueExists,
    QueueManager,
    QueueNotFound,
    StoredMessage,
)
from vibemq_server.core.manager import iso_ms
from vibemq_server.http.auth import log_change
from vibemq_server.http.context import ApiContext, api_context
from vibemq_server.http.models import (
    BrowsedMessage,
    BrowsePage,
    Created,
    Moved,
    MoveIn,
    PayloadEncoding,
    Published,
    PublishIn,
    Purged,
    QueueCreate,
    QueueDetail,
    QueueOptionsIn,
    QueuePage,
    Subscriber,
)
from vibemq_server.protocol.names import valid_queue_name
from vibemq_server.protocol.payload import PAYLOAD_ENCODING, from_core, is_json, to_vibemq

router = APIRouter(prefix="/api/queues", tags=["queues"])
Ctx = Annotated[ApiContext, Depends(api_context)]

#: sortable columns -> the key of a queue (computed for the filtered queues only; the page's
#: full view is built for the page alone)
SORT_KEYS: dict[str, Callable[[Queue], Any]] = {
    "name": lambda q: q.name,
    "messageCount": lambda q: q.count,
    "unackedCount": lambda q: q.unacked_count,
    "subscriberCount": lambda q: len(q.subscriptions),
    "memoryBytes": lambda q: q.nbytes,
    "createdAt": lambda q: q.created_at,
    "deliveryMode": lambda q: str(q.options.delivery_mode),
    "durable": lambda q: q.options.durable,
    "published": lambda q: q.n_published,
    "delivered": lambda q: q.n_delivered,
    "acked": lambda q: q.n_acked,
    "redelivered": lambda q: q.n_redelivered,
    "deadLettered": lambda q: q.n_dead_lettered,
    "expired": lambda q: q.n_expired,
    "dropped": lambda q: q.n_dropped,
}
SortColumn = Literal[
    "name",
    "messageCount",
    "unackedCount",
    "subscriberCount",
    "memoryBytes",
    "createdAt",
    "deliveryMode",
    "durable",
    "published",
    "delivered",
    "acked",
    "redelivered",
    "deadLettered",
    "expired",
    "dropped",
]
_MAX_PATTERN = 256


def _queue(manager: QueueManager, name: str) -> Queue:
    queue = manager.queues.get(name)
    if queue is None:
        raise HTTPException(404, f"queue {name!r} not found")
    return queue


def _changeable(name: str) -> None:
    if name.startswith("$"):
        raise HTTPException(403, f"queue {name!r} belongs to an adapter: not changed over HTTP")
    if not valid_queue_name(name):
        raise HTTPException(
            400, f"invalid queue name {name!r}: 1..256 letters, digits, '-', '_', '.'"
        )


def queue_view(manager: QueueManager, queue: Queue) -> dict[str, Any]:
    info = manager.queue_info(queue.name)
    info.update(
        memoryBytes=queue.nbytes,
        durable=queue.options.durable,
        internal=queue.name.startswith("$"),
    )
    return info


@router.get("", response_model=QueuePage, summary="Queues, a page at a time")
async def list_queues(
    ctx: Ctx,
    page: Annotated[int, Query(ge=1)] = 1,
    page_size: Annotated[int, Query(ge=1, le=1000, alias="pageSize")] = 100,
    name: Annotated[str | None, Query(max_length=_MAX_PATTERN, description="substring")] = None,
    regex: Annotated[
        str | None, Query(max_length=_MAX_PATTERN, description="regular expression (search)")
    ] = None,
    internal: Annotated[bool, Query(description="include adapters' $ queues")] = False,
    sort: SortColumn = "name",
    order: Literal["asc", "desc"] = "asc",
) -> dict[str, Any]:
    manager = ctx.broker.manager
    try:
        pattern = re.compile(regex) if regex else None
    except re.error as exc:
        raise HTTPException(400, f"invalid regex: {exc}") from None
    queues = [
        q
        for q in manager.queues.values()
        if (internal or not q.name.startswith("$"))
        and (name is None or name in q.name)
        and (pattern is None or pattern.search(q.name))
    ]
    key = SORT_KEYS[sort]
    # ties in name order, whatever the column (a stable page boundary)
    queues.sort(key=lambda q: q.name)
    queues.sort(key=key, reverse=order == "desc")
    total = len(queues)
    start = (page - 1) * page_size
    items = [queue_view(manager, q) for q in queues[start : start + page_size]]
    return {
        "items": items,
        "page": page,
        "pageSize": page_size,
        "total": total,
        "pages": max(1, math.ceil(total / page_size)),
    }


@router.get("/{name}", response_model=QueueDetail, summary="One queue")
async def get_queue(ctx: Ctx, name: str) -> dict[str, Any]:
    manager = ctx.broker.manager
    queue = _queue(manager, name)
    view = queue_view(manager, queue)
    view["subscribers"] = [
        Subscriber(id=s.id, prefetch=s.prefetch, unacked=s.n_held) for s in queue.subscriptions
    ]
    return view


def _create(ctx: ApiContext, request: Request, name: str, options: QueueOptionsIn) -> Created:
    _changeable(name)
    manager = ctx.broker.manager
    try:
        queue_options = manager.options_from(options.core_options())
        _, created = manager.create_queue(name, queue_options)
    except InvalidQueueOptions as exc:
        raise HTTPException(400, str(exc)) from None
    except QueueExists as exc:
        raise HTTPException(409, str(exc)) from None
    except PersistenceUnavailable as exc:
        raise HTTPException(503, str(exc)) from None
    if created:
        log_change(request.scope, "create queue", name, **options.core_options())
    return Created(name=name, created=created)


@router.put(
    "/{name}",
    response_model=Created,
    summary="Create a queue (idempotent: the same options again is fine, others are 409)",
)
async def put_queue(
    ctx: Ctx, request: Request, response: Response, name: str, options: QueueOptionsIn | None = None
) -> Created:
    result = _create(ctx, request, name, options or QueueOptionsIn())
    response.status_code = status.HTTP_201_CREATED if result.created else status.HTTP_200_OK
    return result


@router.post("", response_model=Created, status_code=201, summary="Create a queue")
async def post_queue(ctx: Ctx, request: Request, response: Response, body: QueueCreate) -> Created:
    options = QueueOptionsIn.model_validate(body.model_dump(exclude={"name"}))
    result = _create(ctx, request, body.name, options)
    response.status_code = status.HTTP_201_CREATED if result.created else status.HTTP_200_OK
    return result


@router.delete("/{name}", status_code=204, summary="Delete a queue and its messages")
async def delete_queue(ctx: Ctx, request: Request, name: str) -> Response:
    manager = ctx.broker.manager
    queue = _queue(manager, name)
    _changeable(name)
    messages = queue.message_count
    try:
        manager.delete_queue(name)
    except QueueNotFound as exc:
        raise HTTPException(404, str(exc)) from None
    log_change(request.scope, "delete queue", name, messages=messages)
    return Response(status_code=204)


@router.delete(
    "/{name}/contents",
    response_model=Purged,
    summary="Purge: drop every ready message (deliveries in flight stay)",
)
async def purge_queue(ctx: Ctx, request: Request, name: str) -> Purged:
    manager = ctx.broker.manager
    _queue(manager, name)
    _changeable(name)
    purged = manager.purge(name)
    log_change(request.scope, "purge queue", name, purged=purged)
    return Purged(purged=purged)


def _payload_view(msg: StoredMessage) -> tuple[Any, PayloadEncoding]:
    raw = from_core(msg.payload, msg.headers)
    if is_json(raw):
        try:
            return json.loads(raw) if raw.strip() else None, "json"
        except ValueError:
            pass
    try:
        return raw.decode("utf-8"), "text"
    except UnicodeDecodeError:
        return base64.b64encode(raw).decode("ascii"), "base64"


def _browsed(msg: StoredMessage) -> BrowsedMessage:
    payload, encoding = _payload_view(msg)
    return BrowsedMessage(
        id=msg.id,
        payload=payload,
        payload_encoding=encoding,
        size=len(msg.payload),
        headers=dict(msg.headers),
        priority=Priority(msg.priority).name.lower(),
        published_at=iso_ms(msg.published_at),
        expires_at=iso_ms(msg.expires_at) if msg.expires_at else None,
        redelivered=msg.attempts > 0,
        delivery_attempts=msg.attempts,
    )


@router.get(
    "/{name}/messages",
    response_model=BrowsePage,
    summary="Browse ready messages without consuming them",
)
async def browse(
    ctx: Ctx,
    name: str,
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> BrowsePage:
    manager = ctx.broker.manager
    queue = _queue(manager, name)
    messages = [_browsed(m) for m in manager.browse(name, offset, limit)]
    return BrowsePage(
        queue=name,
        offset=offset,
        count=len(messages),
        message_count=queue.message_count,
        messages=messages,
    )


def _payload_bytes(body: PublishIn) -> bytes:
    if body.payload_encoding == "json":
        return json.dumps(body.payload, separators=(",", ":")).encode()
    if not isinstance(body.payload, str):
        raise HTTPException(400, f"payload: a string is needed for {body.payload_encoding}")
    if body.payload_encoding == "text":
        return body.payload.encode("utf-8")
    try:
        return base64.b64decode(body.payload, validate=True)
    except (binascii.Error, ValueError):
        raise HTTPException(400, "payload: not base64") from None


_REFUSED = {
    PublishOutcome.REJECTED_FULL: "queue full: message refused (its overflow strategy)",
    PublishOutcome.BLOCKED: "queue full: BlockPublisher holds publishers back",
}


@router.post(
    "/{name}/messages",
    response_model=Published,
    status_code=201,
    summary="Publish a test message into the queue (and to subscribers of its address)",
)
async def publish(ctx: Ctx, request: Request, name: str, body: PublishIn) -> Published:
    broker = ctx.broker
    cfg = broker.config
    manager = broker.manager
    _queue(manager, name)
    _changeable(name)
    raw = _payload_bytes(body)
    if len(raw) > cfg.max_message_size:
        raise HTTPException(413, f"payload over max_message_size ({cfg.max_message_size})")
    headers = dict(body.headers)
    if len(headers) > cfg.max_headers or any(
        not k or len(v) > cfg.max_header_value for k, v in headers.items()
    ):
        raise HTTPException(
            400,
            f"headers: at most {cfg.max_headers}, non-empty names, values of at most "
            f"{cfg.max_header_value} characters",
        )
    if body.priority is not None:
        headers["priority"] = body.priority
    payload, encoding = to_vibemq(raw)
    if encoding is not None:
        headers[PAYLOAD_ENCODING] = encoding
    msg_id = body.id or str(uuid.uuid4())
    try:
        outcome = manager.publish(name, msg_id, payload, headers)
    except PersistenceUnavailable as exc:
        raise HTTPException(503, str(exc)) from None
    except CoreError as exc:
        raise HTTPException(400, str(exc)) from None
    refused = _REFUSED.get(outcome)
    if refused is not None:
        raise HTTPException(409, refused)
    log_change(request.scope, "publish", name, message_id=msg_id, bytes=len(raw))
    return Published(id=msg_id, outcome=outcome.value)


@router.post(
    "/{name}/move",
    response_model=Moved,
    summary="Move ready messages: a dead-letter queue's back to their original queues, "
    "or all to a target queue",
)
async def move(ctx: Ctx, request: Request, name: str, body: MoveIn | None = None) -> Moved:
    manager = ctx.broker.manager
    body = body or MoveIn()
    _queue(manager, name)
    _changeable(name)
    if body.target is not None:
        _queue(manager, body.target)
        _changeable(body.target)
    try:
        result = manager.move_messages(name, target=body.target, limit=body.limit)
    except PersistenceUnavailable as exc:
        raise HTTPException(503, str(exc)) from None
    log_change(
        request.scope,
        "move messages",
        name,
        to=body.target or "originalQueue",
        moved=result.total,
        kept=result.kept,
    )
    return Moved(moved=result.moved, total=result.total, kept=result.kept)
