"""The API's request and response bodies (pydantic: validated, and described in OpenAPI).
JSON names are camelCase, as in the native protocol's queue options and QueueInfo."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from vibemq_server.config import DeliveryMode, OverflowStrategy


class _Camel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, validate_by_name=True, validate_by_alias=True, extra="forbid"
    )


class QueueOptionsIn(_Camel):
    """Options of a new queue; an option left out takes the broker's ``queue_defaults``."""

    delivery_mode: DeliveryMode | None = None
    max_queue_size: int | None = Field(None, ge=1)
    message_ttl: int | None = Field(None, ge=0, description="ms; 0 = messages never expire")
    enable_dead_letter_queue: bool | None = None
    dead_letter_queue_name: str | None = Field(
        None, min_length=1, max_length=256, description="default <name>.dlq"
    )
    max_retry_attempts: int | None = Field(None, ge=1)
    ack_timeout: int | None = Field(None, ge=1, description="ms")
    overflow_strategy: OverflowStrategy | None = None
    durable: bool | None = None

    def core_options(self) -> dict[str, object]:
        """The options under the names ``QueueManager.options_from`` reads."""
        return {
            key: value for key, value in self.model_dump(by_alias=True, exclude_none=True).items()
        }


class QueueCreate(QueueOptionsIn):
    """``POST /api/queues``: a queue's name and options."""

    name: str = Field(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9_.\-]+$")


class QueueStats(_Camel):
    published: int
    delivered: int
    acked: int
    redelivered: int
    dead_lettered: int
    expired: int
    dropped: int


class Subscriber(_Camel):
    id: str
    prefetch: int
    unacked: int


class QueueOut(_Camel):
    name: str
    message_count: int
    unacked_count: int
    subscriber_count: int
    memory_bytes: int = Field(description="payload bytes of the ready messages")
    delivery_mode: str
    max_size: int
    created_at: str
    message_ttl: int
    overflow_strategy: str
    enable_dead_letter_queue: bool
    dead_letter_queue_name: str | None
    max_retry_attempts: int
    ack_timeout: int
    durable: bool
    internal: bool = Field(description="an adapter's own queue ($ name): read-only here")
    stats: QueueStats


class QueueDetail(QueueOut):
    subscribers: list[Subscriber]


class QueuePage(_Camel):
    items: list[QueueOut]
    page: int
    page_size: int
    total: int = Field(description="queues that match the filter")
    pages: int


class Created(_Camel):
    name: str
    created: bool = Field(description="false: it existed already with these options")


class Purged(_Camel):
    purged: int


PayloadEncoding = Literal["json", "text", "base64"]


class BrowsedMessage(_Camel):
    id: str
    payload: Any = Field(description="JSON when the bytes are JSON, else text, else base64")
    payload_encoding: PayloadEncoding
    size: int = Field(description="bytes")
    headers: dict[str, str]
    priority: str
    published_at: str
    expires_at: str | None
    redelivered: bool
    delivery_attempts: int


class BrowsePage(_Camel):
    queue: str
    offset: int
    count: int
    message_count: int = Field(description="ready messages in the queue")
    messages: list[BrowsedMessage]


class PublishIn(_Camel):
    """A test message. ``payload``: any JSON value when ``payloadEncoding`` is ``json``;
    a string of text, or of base64 for bytes, otherwise."""

    payload: Any = None
    payload_encoding: PayloadEncoding = "json"
    headers: dict[str, str] = Field(default_factory=dict)
    id: str | None = Field(None, min_length=1, max_length=256, description="default: a new id")
    priority: Literal["low", "normal", "high", "critical"] | None = None


class Published(_Camel):
    id: str
    outcome: str


class MoveIn(_Camel):
    """Where to: ``target`` a queue, or (left out) each message's own ``originalQueue``
    (a dead-letter queue sent back)."""

    target: str | None = Field(None, min_length=1, max_length=256)
    limit: int | None = Field(None, ge=1, description="at most this many; default all")


class Moved(_Camel):
    moved: dict[str, int] = Field(description="messages moved, by destination queue")
    total: int
    kept: int = Field(description="left in place: no destination, or it is missing or full")
