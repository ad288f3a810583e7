"""A tiny raw VibeMQ connection for integration tests: asyncio streams plus the project codec.

No client library is involved: frames are built with ``encode`` (or by hand, for bad input)
and every frame the server sends is decoded and kept in ``pending`` until a test asks for it,
so replies, deliveries and unsolicited messages can arrive in any order without being lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import Callable, Mapping

from vibemq_server.protocol import CommandType, FrameDecoder, Limits, Message, decode_body, encode

TIMEOUT = 5.0
# The client side decodes whatever the server sends, however large.
_CLIENT_LIMITS = Limits(max_message_size=2**32 - 1, max_headers=65535, max_header_value=65535)
_ids = itertools.count(1)

Match = Callable[[Message], bool]


def new_id(prefix: str = "m") -> str:
    return f"{prefix}_{next(_ids)}"


def to_payload(value: object) -> bytes:
    """Python value -> JSON payload bytes; bytes pass through untouched (None = no payload)."""
    if value is None:
        return b""
    if isinstance(value, bytes):
        return value
    return json.dumps(value).encode()


class Closed(Exception):
    """The server closed the connection."""


class RawClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = FrameDecoder(_CLIENT_LIMITS.max_message_size)
        self.pending: list[Message] = []
        self.eof = False

    # -- connection ---------------------------------------------------------------------------

    @classmethod
    async def open(cls, port: int, host: str = "127.0.0.1") -> RawClient:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), TIMEOUT)
        return cls(reader, writer)

    @classmethod
    async def connected(cls, port: int, token: str | None = None) -> RawClient:
        """Open and complete Connect; fails the test unless ConnectAck comes back."""
        client = await cls.open(port)
        reply = await client.connect(token)
        assert reply.type is CommandType.CONNECT_ACK, reply
        return client

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.writer.wait_closed(), TIMEOUT)

    # -- raw I/O ------------------------------------------------------------------------------

    def send(self, msg: Message) -> None:
        self.writer.write(encode(msg))

    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    async def _read_more(self) -> None:
        try:
            data = await self.reader.read(65536)
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            self.eof = True
            raise Closed("server closed the connection")
        for body in self.decoder.feed(data):
            self.pending.append(decode_body(body, _CLIENT_LIMITS))

    async def recv(self, match: Match | None = None, timeout: float = TIMEOUT) -> Message:
        """The first received message that matches (any message when ``match`` is None)."""
        async with asyncio.timeout(timeout):
            while True:
                for i, msg in enumerate(self.pending):
                    if match is None or match(msg):
                        return self.pending.pop(i)
                if self.eof:
                    raise Closed("server closed the connection")
                await self._read_more()

    async def recv_type(self, kind: CommandType, timeout: float = TIMEOUT) -> Message:
        return await self.recv(lambda m: m.type is kind, timeout)

    async def reply_to(self, msg_id: str, timeout: float = TIMEOUT) -> Message:
        """The reply carrying ``msg_id`` (deliveries, which reuse message ids, are skipped)."""
        return await self.recv(
            lambda m: m.id == msg_id and m.type is not CommandType.DELIVER, timeout
        )

    async def request(self, msg: Message, timeout: float = TIMEOUT) -> Message:
        self.send(msg)
        return await self.reply_to(msg.id, timeout)

    async def expect_nothing(self, match: Match | None = None, duration: float = 0.3) -> None:
        """Fail if a (matching) message arrives within ``duration`` seconds."""
        try:
            msg = await self.recv(match, timeout=duration)
        except TimeoutError:
            return
        raise AssertionError(f"unexpected message: {msg}")

    async def wait_closed(self, timeout: float = TIMEOUT) -> list[Message]:
        """Read until the server closes the connection; returns every message left unread."""
        async with asyncio.timeout(timeout):
            while not self.eof:
                with contextlib.suppress(Closed):
                    await self._read_more()
        out, self.pending = self.pending, []
        return out

    # -- commands -----------------------------------------------------------------------------

    async def connect(self, token: str | None = None, msg_id: str | None = None) -> Message:
        headers = {"clientVersion": "test"}
        if token is not None:
            headers["authToken"] = token
        return await self.request(
            Message(CommandType.CONNECT, msg_id or new_id("conn"), headers=headers)
        )

    async def ping(self) -> Message:
        return await self.request(Message(CommandType.PING, new_id("ping")))

    def publish_msg(
        self,
        queue: str,
        payload: object = None,
        headers: Mapping[str, str] | None = None,
        msg_id: str | None = None,
    ) -> Message:
        return Message(
            CommandType.PUBLISH,
            msg_id or new_id("msg"),
            queue,
            to_payload(payload),
            dict(headers or {}),
        )

    async def publish(
        self,
        queue: str,
        payload: object = None,
        headers: Mapping[str, str] | None = None,
        msg_id: str | None = None,
    ) -> Message:
        return await self.request(self.publish_msg(queue, payload, headers, msg_id))

    async def subscribe(self, queue: str, prefetch: int | None = None) -> Message:
        headers = {} if prefetch is None else {"prefetch": str(prefetch)}
        return await self.request(
            Message(CommandType.SUBSCRIBE, new_id("sub"), queue, headers=headers)
        )

    async def unsubscribe(self, queue: str) -> Message:
        return await self.request(Message(CommandType.UNSUBSCRIBE, new_id("unsub"), queue))

    def ack(self, msg_id: str, *, by_header: bool = True) -> None:
        """Ack a delivery: docs form (header ``messageId``) or code form (the Ack's own id)."""
        if by_header:
            self.send(Message(CommandType.ACK, new_id("ack"), headers={"messageId": msg_id}))
        else:
            self.send(Message(CommandType.ACK, msg_id))

    async def create_queue(
        self,
        queue: str,
        headers: Mapping[str, str] | None = None,
        options: Mapping[str, object] | None = None,
    ) -> Message:
        msg = Message(
            CommandType.CREATE_QUEUE,
            new_id("create"),
            queue,
            to_payload(dict(options) if options is not None else None),
            dict(headers or {}),
        )
        return await self.request(msg)

    async def delete_queue(self, queue: str) -> Message:
        return await self.request(Message(CommandType.DELETE_QUEUE, new_id("delete"), queue))

    async def queue_info(self, queue: str) -> Message:
        return await self.request(Message(CommandType.QUEUE_INFO, new_id("info"), queue))

    async def list_queues(self) -> Message:
        return await self.request(Message(CommandType.LIST_QUEUES, new_id("list")))

    async def delivery(self, queue: str | None = None, timeout: float = TIMEOUT) -> Message:
        return await self.recv(
            lambda m: m.type is CommandType.DELIVER and (queue is None or m.queue == queue), timeout
        )

    async def deliveries(
        self, n: int, queue: str | None = None, timeout: float = TIMEOUT
    ) -> list[Message]:
        return [await self.delivery(queue, timeout) for _ in range(n)]


def assert_ok(reply: Message, kind: CommandType) -> Message:
    assert reply.type is kind, f"expected {kind.name}, got {reply}"
    return reply


def assert_error(reply: Message, code: str, msg_id: str | None = None) -> Message:
    assert reply.type is CommandType.ERROR, f"expected Error {code}, got {reply}"
    assert reply.error_code == code, reply
    assert reply.error_message, reply
    assert reply.id, "an Error always carries an id"
    if msg_id is not None:
        assert reply.id == msg_id, reply
    return reply
