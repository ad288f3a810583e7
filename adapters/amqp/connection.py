"""One AMQP 0-9-1 connection: the transport, the connection state machine and method dispatch.

Connection states and the connection methods each accepts are in ``_ACCEPTS``; once open,
methods on channels 1.. go to ``_CHANNEL_HANDLERS`` (one handler per pamqp method class).
Errors are RabbitMQ's: a channel-level one (404, 405, 406, 403) closes that channel with
channel.close; a connection-level one (501..541) closes the connection with
connection.close. The reply text says what was wrong.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Any, cast

import structlog
from pamqp import commands
from pamqp.base import Frame as PamqpFrame

from vibemq_server.adapters.amqp.channel import (
    UNLIMITED,
    AmqpConsumer,
    Channel,
    Pending,
    _Getter,
    consumer_count,
)
from vibemq_server.adapters.amqp.codec import (
    HEARTBEAT,
    PROTOCOL_HEADER,
    AmqpError,
    BodyFrame,
    FrameParser,
    HeaderFrame,
    Heartbeat,
    MethodFrame,
    ProtocolHeader,
    ReplyCode,
    decode_table,
    encode_ack,
    encode_get_ok,
    encode_method,
    encode_nack,
    encode_return,
    text,
)
from vibemq_server.core import CoreError, QueueExists, QueueNotFound
from vibemq_server.core.exchanges import (
    ExchangeAccessRefused,
    ExchangeInUse,
    ExchangeMismatch,
    ExchangeNotFound,
)
from vibemq_server.server.transport import BufferedConnection

if TYPE_CHECKING:
    from vibemq_server.adapters.amqp.server import AmqpServer

_ids = itertools.count(1)

_CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "direct_reply_to": False,
}


class State(Enum):
    AWAIT_HEADER = "await_header"
    AWAIT_START_OK = "await_start_ok"
    AWAIT_TUNE_OK = "await_tune_ok"
    AWAIT_OPEN = "await_open"
    OPEN = "open"
    CLOSING = "closing"  # we sent connection.close; only close/close-ok count now
    CLOSED = "closed"


#: The connection methods (channel 0) each state accepts.
_ACCEPTS: dict[State, frozenset[type]] = {
    State.AWAIT_HEADER: frozenset(),
    State.AWAIT_START_OK: frozenset({commands.Connection.StartOk}),
    State.AWAIT_TUNE_OK: frozenset({commands.Connection.TuneOk}),
    State.AWAIT_OPEN: frozenset({commands.Connection.Open, commands.Connection.Close}),
    State.OPEN: frozenset({commands.Connection.Close, commands.Connection.CloseOk}),
    State.CLOSING: frozenset({commands.Connection.Close, commands.Connection.CloseOk}),
    State.CLOSED: frozenset(),
}

_CORE_ERRORS: dict[type[Exception], ReplyCode] = {
    QueueNotFound: ReplyCode.NOT_FOUND,
    ExchangeNotFound: ReplyCode.NOT_FOUND,
    QueueExists: ReplyCode.PRECONDITION_FAILED,
    ExchangeMismatch: ReplyCode.PRECONDITION_FAILED,
    ExchangeInUse: ReplyCode.PRECONDITION_FAILED,
    ExchangeAccessRefused: ReplyCode.ACCESS_REFUSED,
}


def _error_name(code: int) -> str:
    try:
        return ReplyCode(code).name
    except ValueError:
        return "ERROR"


class AmqpConnection(BufferedConnection):
    def __init__(self, server: AmqpServer) -> None:
        self.server = server
        self.manager = server.manager
        self._init_buffers(
            asyncio.get_running_loop(), server.config.write_buffer_high_bytes, server.batch
        )
        self.conn_id = f"amqp_{next(_ids)}"
        self.parser = FrameParser(server.cfg.frame_max)
        self.state = State.AWAIT_HEADER
        self.channels: dict[int, Channel] = {}
        self.frame_max = server.cfg.frame_max
        self.channel_max = server.cfg.channel_max
        self.heartbeat = 0
        self.capabilities: dict[str, Any] = {}
        self.opened_at = self.loop.time()
        self.last_rx = self.opened_at
        self.last_heartbeat_sent = self.opened_at
        self.closing_since = 0.0
        self.blocked = False
        self._published = False  # this read published something (memory alarm)
        self._refill: set[str] = set()
        self._confirms: dict[Channel, list[int]] = {}
        self._durable_batch: list[tuple[Channel, int]] | None = None
        self._durable_epoch = -1
        self.log: structlog.typing.FilteringBoundLogger = structlog.get_logger("vibemq.amqp")

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._accept(transport, lambda: self.server.register(self)):
            self.state = State.CLOSED

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        self.last_rx = self.loop.time()
        error: AmqpError | None = None
        try:
            frames = self.parser.feed(data)
        except AmqpError as exc:
            frames = list(exc.frames)
            error = exc
        reads = self.server.batch
        reads.begin()
        try:
            for frame in frames:
                if self.state is State.CLOSED:
                    break
                try:
                    _FRAME_HANDLERS[type(frame)](self, frame)
                except AmqpError as exc:
                    self._fail(exc)
                except CoreError as exc:
                    code = _CORE_ERRORS.get(type(exc), ReplyCode.PRECONDITION_FAILED)
                    channel = getattr(frame, "channel", 0)
                    text = f"{_error_name(code)} - {exc}"
                    self._fail(AmqpError(code, text, channel))
                except Exception:  # a bug must cost this connection only, never the broker
                    self.log.exception("internal error handling a frame")
                    self._fail(AmqpError(ReplyCode.INTERNAL_ERROR, "INTERNAL_ERROR", 0))
            if error is not None and self.state is not State.CLOSED:
                self.log.warning("malformed frame", code=int(error.code), error=error.text)
                self._fail(error)
            self._after_read()
        finally:
            reads.end()

    def _after_read(self) -> None:
        for channel, seqs in self._confirms.items():
            self._send_confirms(channel, seqs)
        self._confirms.clear()
        if self._refill:
            queues, self._refill = self._refill, set()
            for name in queues:
                queue = self.manager.queues.get(name)
                if queue is not None:
                    queue.dispatch()
        published, self._published = self._published, False
        # Over the memory high watermark only connections that publish stop being read (as in
        # RabbitMQ): a consumer's acks, or a new connection, are what frees memory.
        if published and self.manager.memory_blocked and not self._reading_paused:
            self.pause_reading()
            # Not once connection.close is out: nothing but close-ok may follow it (found
            # by tests/unit/test_amqp_session_fuzz.py).
            if self.capabilities.get("connection.blocked") and self.state is State.OPEN:
                self.send(encode_method(0, commands.Connection.Blocked("memory high watermark")))
                self.blocked = True
            self.manager.wait_for_memory(self._memory_ok)

    def _memory_ok(self) -> None:
        if self.blocked:
            self.blocked = False
            if self.state is State.OPEN:  # (as for connection.blocked, above)
                self.send(encode_method(0, commands.Connection.Unblocked()))
        self.resume_reading()

    def _writable_again(self) -> None:
        for channel in list(self.channels.values()):
            for consumer in list(channel.consumers.values()):
                if consumer.sub is not None:
                    consumer.sub.queue.dispatch()

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self.state = State.CLOSED
        self.server.unregister(self)
        self._release_all()
        self.log.debug("connection closed", error=str(exc) if exc else None)

    def _stop_deliveries(self) -> None:
        """Before the channels are released one by one: releasing one dispatches its queues,
        which must not deliver to another channel of this connection that is going too
        (deliveries used to follow connection.close and close-ok; found by
        tests/unit/test_amqp_session_fuzz.py)."""
        for channel in self.channels.values():
            channel.closing = True

    def _release_all(self) -> None:
        self._stop_deliveries()
        queues: set[str] = set()
        for channel in list(self.channels.values()):
            queues |= self._release_channel(channel)
        self.channels.clear()
        self.server.connection_gone(self)
        for name in queues:
            queue = self.manager.queues.get(name)
            if queue is not None:
                queue.dispatch()

    def _release_channel(self, channel: Channel) -> set[str]:
        consumer_queues = [c.queue for c in channel.consumers.values()]
        queues = channel.release()
        for name in consumer_queues:
            self.server.consumer_gone(name)
        return queues

    # -- housekeeping ------------------------------------------------------------------------------

    def check_timers(self, now: float, keepalive: float, frame_timeout: float) -> None:
        if self._closing or self.state is State.CLOSED:
            return
        if self.state is State.CLOSING:
            if now - self.closing_since > 2.0:
                self.abort()  # no close-ok in time
            return
        if self.state is not State.OPEN:
            if now - self.opened_at > self.server.cfg.handshake_timeout_s:
                self.log.info("handshake timed out", state=self.state.value)
                self.state = State.CLOSED
                self.abort()
            return
        if self._reading_paused:
            self.last_rx = now
        heartbeat = self.heartbeat
        if not heartbeat:
            return
        if now - self.last_rx > 2 * heartbeat:
            self.log.info("missed heartbeats; closing", idle_s=round(now - self.last_rx, 1))
            self.state = State.CLOSED
            self.abort()
            return
        if now - self.last_heartbeat_sent >= heartbeat / 2:
            self.last_heartbeat_sent = now
            self.send(HEARTBEAT)

    def shutdown(self, reason: str) -> None:
        """Broker shutdown: connection.close 320 CONNECTION_FORCED."""
        if self.state is State.OPEN:
            self._close_connection(ReplyCode.CONNECTION_FORCED, "CONNECTION_FORCED - " + reason)
        else:
            self.close()

    # -- errors ------------------------------------------------------------------------------------

    def _fail(self, exc: AmqpError) -> None:
        if exc.fatal or exc.channel == 0:
            self.log.warning("connection error", code=int(exc.code), error=exc.text)
            self._close_connection(exc.code, exc.text, exc.class_id, exc.method_id)
            return
        channel = self.channels.get(exc.channel)
        if channel is None or channel.closing:
            return
        self.log.info("channel error", channel=exc.channel, code=int(exc.code), error=exc.text)
        self._flush_confirms(channel)
        self._refill |= self._release_channel(channel)
        channel.closing = True
        self.send(
            encode_method(
                exc.channel,
                commands.Channel.Close(int(exc.code), exc.text[:255], exc.class_id, exc.method_id),
            )
        )

    def _flush_confirms(self, channel: Channel) -> None:
        """Send the confirms this read gathered for ``channel`` now, ahead of a frame that
        ends it: nothing may follow a channel's close or close-ok, or connection.close, and
        they were gathered for publishes routed before it (found by
        tests/unit/test_amqp_session_fuzz.py)."""
        seqs = self._confirms.pop(channel, None)
        if seqs:
            self._send_confirms(channel, seqs)

    def _close_connection(
        self, code: int, text: str, class_id: int = 0, method_id: int = 0
    ) -> None:
        if self.state in (State.CLOSING, State.CLOSED):
            return
        if self.state is State.AWAIT_HEADER:
            self.state = State.CLOSED
            self.close()
            return
        for confirm_channel in list(self._confirms):
            self._flush_confirms(confirm_channel)
        self.send(
            encode_method(0, commands.Connection.Close(int(code), text[:255], class_id, method_id))
        )
        self.state = State.CLOSING
        self.closing_since = self.loop.time()
        self._refill |= set()
        self._stop_deliveries()
        queues: set[str] = set()
        for channel in list(self.channels.values()):
            queues |= self._release_channel(channel)
        self.channels.clear()
        self._refill |= queues

    # -- frames ------------------------------------------------------------------------------------

    def on_protocol_header(self, frame: ProtocolHeader) -> None:
        if self.state is not State.AWAIT_HEADER:
            raise AmqpError(ReplyCode.FRAME_ERROR, "FRAME_ERROR - unexpected protocol header", 0)
        if not frame.ok:
            self.log.info("wrong protocol header", header=frame.raw.hex())
            self.send(PROTOCOL_HEADER)
            self.state = State.CLOSED
            self.close()
            return
        self.send(
            encode_method(
                0,
                commands.Connection.Start(
                    server_properties={
                        "product": "VibeMQ",
                        "platform": "Python",
                        "version": "0.1",
                        "capabilities": cast(Any, _CAPABILITIES),
                    },
                    mechanisms="PLAIN AMQPLAIN",
                    locales="en_US",
                ),
            )
        )
        self.state = State.AWAIT_START_OK

    def on_heartbeat(self, frame: Heartbeat) -> None:
        pass  # last_rx is updated for every read

    def on_method(self, frame: MethodFrame) -> None:
        method = frame.method
        if frame.channel == 0:
            if type(method) not in _ACCEPTS[self.state]:
                if self.state is State.CLOSING:
                    return  # everything but close/close-ok is ignored now
                raise AmqpError(
                    ReplyCode.COMMAND_INVALID
                    if self.state is State.OPEN
                    else ReplyCode.CHANNEL_ERROR,
                    f"COMMAND_INVALID - {method.name} not allowed on channel 0 "
                    f"in state {self.state.value}",
                    0,
                    *_ids_of(method),
                )
            _CONNECTION_HANDLERS[type(method)](self, method)
            return
        if self.state is not State.OPEN:
            if self.state is State.CLOSING:
                return
            raise AmqpError(
                ReplyCode.CHANNEL_ERROR,
                f"CHANNEL_ERROR - {method.name} before the connection is open",
                0,
                *_ids_of(method),
            )
        channel = self.channels.get(frame.channel)
        if channel is None:
            if isinstance(method, commands.Channel.Open):
                self.open_channel(frame.channel)
                return
            raise AmqpError(
                ReplyCode.CHANNEL_ERROR,
                f"CHANNEL_ERROR - expected 'channel.open' on channel {frame.channel}",
                0,
                *_ids_of(method),
            )
        if channel.closing:
            if isinstance(method, commands.Channel.CloseOk | commands.Channel.Close):
                if isinstance(method, commands.Channel.Close):
                    self.send(encode_method(channel.number, commands.Channel.CloseOk()))
                del self.channels[channel.number]
            return  # everything else on a closing channel is dropped, as the spec says
        if (channel.pending is not None and channel.pending.body_size < 0) or (
            channel.pending is not None and channel.pending.received < channel.pending.body_size
        ):
            raise AmqpError(
                ReplyCode.UNEXPECTED_FRAME,
                f"UNEXPECTED_FRAME - expected content on channel {channel.number}, got "
                f"{method.name}",
                0,
                *_ids_of(method),
            )
        handler = _CHANNEL_HANDLERS.get(type(method))
        if handler is None:
            raise AmqpError(
                ReplyCode.COMMAND_INVALID
                if not isinstance(method, commands.Channel.Open)
                else ReplyCode.CHANNEL_ERROR,
                f"COMMAND_INVALID - unexpected {method.name} on channel {channel.number}",
                0,
                *_ids_of(method),
            )
        handler(self, channel, method)

    def on_header(self, frame: HeaderFrame) -> None:
        channel = self._content_channel(frame.channel)
        if channel is None:
            return
        if channel.content_header(
            frame.body_size, frame.properties, self.server.cfg.max_message_size
        ):
            self._publish(channel)

    def on_body(self, frame: BodyFrame) -> None:
        channel = self._content_channel(frame.channel)
        if channel is None:
            return
        if channel.content_body(frame.data):
            self._publish(channel)

    def _content_channel(self, number: int) -> Channel | None:
        if self.state is not State.OPEN:
            if self.state is State.CLOSING:
                return None
            raise AmqpError(ReplyCode.UNEXPECTED_FRAME, "UNEXPECTED_FRAME - content frame", 0)
        channel = self.channels.get(number)
        if channel is None:
            raise AmqpError(
                ReplyCode.CHANNEL_ERROR, f"CHANNEL_ERROR - channel {number} is not open", 0
            )
        if channel.closing:
            return None
        return channel

    # -- connection methods ------------------------------------------------------------------------

    def on_start_ok(self, method: commands.Connection.StartOk) -> None:
        props = method.client_properties or {}
        caps = props.get("capabilities")
        if isinstance(caps, dict):
            self.capabilities = caps
        mechanism = text(method.mechanism)
        response = method.response
        raw = response.encode("latin-1") if isinstance(response, str) else bytes(response or b"")
        if mechanism == "PLAIN":
            parts = raw.split(b"\x00")
            if len(parts) != 3:
                raise AmqpError(ReplyCode.ACCESS_REFUSED, "ACCESS_REFUSED - bad PLAIN response", 0)
            username, password = (
                parts[1].decode("utf-8", "replace"),
                parts[2].decode("utf-8", "replace"),
            )
        elif mechanism == "AMQPLAIN":
            try:
                table = decode_table(len(raw).to_bytes(4, "big") + raw)
            except AmqpError:
                table = {}
            username = text(table.get("LOGIN"))
            password = text(table.get("PASSWORD"))
        else:
            # RabbitMQ: 503 for a mechanism it does not offer (rabbit_reader).
            raise AmqpError(
                ReplyCode.COMMAND_INVALID,
                f"COMMAND_INVALID - unknown authentication mechanism {mechanism!r} "
                "(PLAIN, AMQPLAIN)",
                0,
            )
        if not self.server.authenticate(username, password):
            self.log.warning("authentication refused", user=username)
            raise AmqpError(
                ReplyCode.ACCESS_REFUSED,
                f"ACCESS_REFUSED - Login was refused using authentication mechanism {mechanism}",
                0,
            )
        self.log = self.log.bind(user=username)
        cfg = self.server.cfg
        self.send(
            encode_method(
                0,
                commands.Connection.Tune(
                    channel_max=cfg.channel_max, frame_max=cfg.frame_max, heartbeat=cfg.heartbeat_s
                ),
            )
        )
        self.state = State.AWAIT_TUNE_OK

    def on_tune_ok(self, method: commands.Connection.TuneOk) -> None:
        cfg = self.server.cfg
        frame_max = method.frame_max or cfg.frame_max
        if frame_max < 4096 or frame_max > cfg.frame_max:
            raise AmqpError(
                ReplyCode.NOT_ALLOWED,
                f"NOT_ALLOWED - frame_max {frame_max} outside 4096..{cfg.frame_max}",
                0,
            )
        self.frame_max = frame_max
        self.parser.max_frame_size = frame_max
        self.channel_max = min(method.channel_max or cfg.channel_max, cfg.channel_max)
        self.heartbeat = method.heartbeat
        self.state = State.AWAIT_OPEN

    def on_open(self, method: commands.Connection.Open) -> None:
        if text(method.virtual_host) != "/":
            raise AmqpError(
                ReplyCode.NOT_ALLOWED,
                f"NOT_ALLOWED - vhost {text(method.virtual_host)!r} not found (only '/')",
                0,
                10,
                40,
            )
        self.send(encode_method(0, commands.Connection.OpenOk()))
        self.state = State.OPEN
        self.log.debug("connection open", heartbeat=self.heartbeat, frame_max=self.frame_max)

    def on_close(self, method: commands.Connection.Close) -> None:
        self.send(encode_method(0, commands.Connection.CloseOk()))
        self._release_all()
        self.state = State.CLOSED
        self.close()

    def on_close_ok(self, method: commands.Connection.CloseOk) -> None:
        self.state = State.CLOSED
        self.close()

    # -- channel methods ---------------------------------------------------------------------------

    def open_channel(self, number: int) -> None:
        if number > self.channel_max:
            raise AmqpError(
                ReplyCode.CHANNEL_ERROR,
                f"CHANNEL_ERROR - channel {number} over channel_max {self.channel_max}",
                0,
                20,
                10,
            )
        self.channels[number] = Channel(self, number)
        self.send(encode_method(number, commands.Channel.OpenOk()))

    def ch_open(self, channel: Channel, method: commands.Channel.Open) -> None:
        raise AmqpError(
            ReplyCode.CHANNEL_ERROR,
            f"CHANNEL_ERROR - second 'channel.open' seen on channel {channel.number}",
            0,
            20,
            10,
        )

    def ch_close(self, channel: Channel, method: commands.Channel.Close) -> None:
        self._flush_confirms(channel)
        self._refill |= self._release_channel(channel)
        del self.channels[channel.number]
        self.send(encode_method(channel.number, commands.Channel.CloseOk()))

    def ch_close_ok(self, channel: Channel, method: commands.Channel.CloseOk) -> None:
        pass  # only meaningful while closing (handled before dispatch)

    def ch_flow(self, channel: Channel, method: commands.Channel.Flow) -> None:
        channel.flow = bool(method.active)
        self.send(encode_method(channel.number, commands.Channel.FlowOk(active=channel.flow)))
        if channel.flow:
            for consumer in channel.consumers.values():
                self._refill.add(consumer.queue)

    def ch_flow_ok(self, channel: Channel, method: commands.Channel.FlowOk) -> None:
        pass

    # exchanges

    def ex_declare(self, channel: Channel, method: commands.Exchange.Declare) -> None:
        exchanges = self._exchanges()
        name = text(method.exchange)
        exchanges.declare(
            name,
            text(method.exchange_type) or "direct",
            durable=bool(method.durable),
            auto_delete=bool(method.auto_delete),
            internal=bool(method.internal),
            arguments=dict(method.arguments or {}),
            passive=bool(method.passive),
        )
        if not method.nowait:
            self.send(encode_method(channel.number, commands.Exchange.DeclareOk()))

    def ex_delete(self, channel: Channel, method: commands.Exchange.Delete) -> None:
        # RabbitMQ answers delete-ok for an exchange that is not there.
        with contextlib.suppress(ExchangeNotFound):
            self._exchanges().delete(text(method.exchange), if_unused=bool(method.if_unused))
        if not method.nowait:
            self.send(encode_method(channel.number, commands.Exchange.DeleteOk()))

    def ex_bind(self, channel: Channel, method: commands.Exchange.Bind) -> None:
        self._exchanges().bind_exchange(
            text(method.destination),
            text(method.source),
            text(method.routing_key),
            dict(method.arguments or {}),
        )
        if not method.nowait:
            self.send(encode_method(channel.number, commands.Exchange.BindOk()))

    def ex_unbind(self, channel: Channel, method: commands.Exchange.Unbind) -> None:
        self._exchanges().unbind_exchange(
            text(method.destination),
            text(method.source),
            text(method.routing_key),
            dict(method.arguments or {}),
        )
        if not method.nowait:
            self.send(encode_method(channel.number, commands.Exchange.UnbindOk()))

    # queues

    def _queue_name(self, channel: Channel, name: str) -> str:
        """An empty queue name means the channel's last declared queue, as in RabbitMQ."""
        name = name or channel.last_queue
        if not name:
            raise AmqpError(
                ReplyCode.NOT_FOUND, "NOT_FOUND - no previously declared queue", channel.number
            )
        if name.startswith("$"):
            # The adapters' own queues (the durable tables, MQTT sessions) are no client's:
            # queue.delete/purge/bind of "$amqp.bindings" lost the bindings at the next
            # restart (found by tests/unit/test_amqp_session_fuzz.py).
            raise AmqpError(
                ReplyCode.NOT_FOUND, f"NOT_FOUND - no queue '{name}' in vhost '/'", channel.number
            )
        return name

    def _check_exclusive(self, channel: Channel, name: str, class_id: int, method_id: int) -> None:
        owner = self.server.exclusive.get(name)
        if owner is not None and owner is not self:
            raise AmqpError(
                ReplyCode.RESOURCE_LOCKED,
                f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{name}' "
                "in vhost '/'",
                channel.number,
                class_id,
                method_id,
            )

    def q_declare(self, channel: Channel, method: commands.Queue.Declare) -> None:
        server = self.server
        manager = self.manager
        name = text(method.queue)
        if not name:
            name = f"amq.gen-{server.next_msg_id()}"
        elif name.startswith("amq.") and not method.passive:
            raise AmqpError(
                ReplyCode.ACCESS_REFUSED,
                f"ACCESS_REFUSED - queue name '{name}' contains reserved prefix 'amq.*'",
                channel.number,
                50,
                10,
            )
        self._check_exclusive(channel, name, 50, 10)
        existing = manager.queues.get(name)
        if method.passive:
            if existing is None or name.startswith("$"):
                raise AmqpError(
                    ReplyCode.NOT_FOUND,
                    f"NOT_FOUND - no queue '{name}' in vhost '/'",
                    channel.number,
                    50,
                    10,
                )
        else:
            args = dict(method.arguments or {})
            if existing is None:
                manager.create_queue(name, server.queue_options(bool(method.durable), args))
                server.declared(name, bool(method.durable), args)
                if method.exclusive:
                    server.exclusive[name] = self
                if method.auto_delete:
                    server.auto_delete.add(name)
            elif args or existing.options.durable != bool(method.durable):
                # Redeclared: the same properties, or 406 (a queue from another protocol
                # declared without arguments is taken as it is).
                wanted = server.queue_options(bool(method.durable), args)
                if (wanted != existing.options or server.args_differ(name, args)) and (
                    args or existing.options.durable != wanted.durable
                ):
                    raise AmqpError(
                        ReplyCode.PRECONDITION_FAILED,
                        f"PRECONDITION_FAILED - inequivalent arg 'durable' or arguments for "
                        f"queue '{name}' in vhost '/'",
                        channel.number,
                        50,
                        10,
                    )
        channel.last_queue = name
        server.touch(name)
        if not method.nowait:
            count, consumers = server.message_count(name)
            self.send(
                encode_method(
                    channel.number,
                    commands.Queue.DeclareOk(
                        queue=name, message_count=count, consumer_count=consumers
                    ),
                )
            )

    def q_bind(self, channel: Channel, method: commands.Queue.Bind) -> None:
        name = self._queue_name(channel, text(method.queue))
        self._check_exclusive(channel, name, 50, 20)
        self._exchanges().bind_queue(
            name, text(method.exchange), text(method.routing_key), dict(method.arguments or {})
        )
        if not method.nowait:
            self.send(encode_method(channel.number, commands.Queue.BindOk()))

    def q_unbind(self, channel: Channel, method: commands.Queue.Unbind) -> None:
        name = self._queue_name(channel, text(method.queue))
        self._exchanges().unbind_queue(
            name, text(method.exchange), text(method.routing_key), dict(method.arguments or {})
        )
        self.send(encode_method(channel.number, commands.Queue.UnbindOk()))

    def q_purge(self, channel: Channel, method: commands.Queue.Purge) -> None:
        name = self._queue_name(channel, text(method.queue))
        self._check_exclusive(channel, name, 50, 30)
        count = self.manager.purge(name)
        if not method.nowait:
            self.send(encode_method(channel.number, commands.Queue.PurgeOk(message_count=count)))

    def q_delete(self, channel: Channel, method: commands.Queue.Delete) -> None:
        name = self._queue_name(channel, text(method.queue))
        self._check_exclusive(channel, name, 50, 40)
        queue = self.manager.queues.get(name)
        count = 0
        if queue is not None:
            if method.if_unused and consumer_count(queue):
                raise AmqpError(
                    ReplyCode.PRECONDITION_FAILED,
                    f"PRECONDITION_FAILED - queue '{name}' in vhost '/' in use",
                    channel.number,
                    50,
                    40,
                )
            if method.if_empty and queue.message_count:
                raise AmqpError(
                    ReplyCode.PRECONDITION_FAILED,
                    f"PRECONDITION_FAILED - queue '{name}' in vhost '/' is not empty",
                    channel.number,
                    50,
                    40,
                )
            count = self.server.delete_queue(name)
        if not method.nowait:
            self.send(encode_method(channel.number, commands.Queue.DeleteOk(message_count=count)))

    # basic

    def b_qos(self, channel: Channel, method: commands.Basic.Qos) -> None:
        if method.global_:
            channel.global_prefetch = method.prefetch_count
            for consumer in channel.consumers.values():
                self._refill.add(consumer.queue)
        else:
            channel.prefetch = method.prefetch_count
        self.send(encode_method(channel.number, commands.Basic.QosOk()))

    def b_consume(self, channel: Channel, method: commands.Basic.Consume) -> None:
        name = self._queue_name(channel, text(method.queue))
        self._check_exclusive(channel, name, 60, 20)
        queue = self.manager.queues.get(name)
        if queue is None or name.startswith("$"):
            raise AmqpError(
                ReplyCode.NOT_FOUND,
                f"NOT_FOUND - no queue '{name}' in vhost '/'",
                channel.number,
                60,
                20,
            )
        tag = text(method.consumer_tag) or channel.new_consumer_tag()
        if tag in channel.consumers:
            raise AmqpError(
                ReplyCode.NOT_ALLOWED,
                f"NOT_ALLOWED - attempt to reuse consumer tag '{tag}'",
                0,
                60,
                20,
            )
        if name in self.server.exclusive_consumers or (method.exclusive and consumer_count(queue)):
            raise AmqpError(
                ReplyCode.ACCESS_REFUSED,
                f"ACCESS_REFUSED - queue '{name}' in vhost '/' in exclusive use",
                channel.number,
                60,
                20,
            )
        consumer = AmqpConsumer(channel, tag, name, bool(method.no_ack))
        channel.consumers[tag] = consumer
        if method.exclusive:
            self.server.exclusive_consumers[name] = consumer
        prefetch = UNLIMITED if method.no_ack or not channel.prefetch else channel.prefetch
        if not method.nowait:
            self.send(encode_method(channel.number, commands.Basic.ConsumeOk(consumer_tag=tag)))
        consumer.sub = self.manager.subscribe(name, tag, consumer, prefetch, dispatch=False)
        self._refill.add(name)

    def b_cancel(self, channel: Channel, method: commands.Basic.Cancel) -> None:
        tag = text(method.consumer_tag)
        consumer = channel.consumers.pop(tag, None)
        if consumer is not None:
            self.server.consumer_ended(consumer)
            if consumer.sub is not None:
                # Unacknowledged deliveries stay with the channel until acked or it ends.
                self.manager.detach(consumer.sub)
            self.server.consumer_gone(consumer.queue)
        if not method.nowait:
            self.send(encode_method(channel.number, commands.Basic.CancelOk(consumer_tag=tag)))

    def consumer_cancelled(self, channel: Channel, tag: str) -> None:
        if self.capabilities.get("consumer_cancel_notify") and not channel.closing:
            self.send(encode_method(channel.number, commands.Basic.Cancel(consumer_tag=tag)))

    def b_publish(self, channel: Channel, method: commands.Basic.Publish) -> None:
        exchange = text(method.exchange)
        if exchange:
            found = self._exchanges().get(exchange)
            if found is None:
                raise AmqpError(
                    ReplyCode.NOT_FOUND,
                    f"NOT_FOUND - no exchange '{exchange}' in vhost '/'",
                    channel.number,
                    60,
                    40,
                )
            if found.internal:
                raise AmqpError(
                    ReplyCode.ACCESS_REFUSED,
                    f"ACCESS_REFUSED - cannot publish to internal exchange '{exchange}'",
                    channel.number,
                    60,
                    40,
                )
        channel.pending = Pending(exchange, text(method.routing_key), bool(method.mandatory))

    def _publish(self, channel: Channel) -> None:
        pending = channel.pending
        assert pending is not None
        channel.pending = None
        self._published = True
        body = b"".join(pending.chunks) if len(pending.chunks) != 1 else pending.chunks[0]
        seq = 0
        if channel.confirm:
            channel.publish_seq += 1
            seq = channel.publish_seq
        if channel.tx is not None:
            channel.tx.append(lambda: self._route(channel, pending, body, 0))
            return
        self._route(channel, pending, body, seq)

    def _route(self, channel: Channel, pending: Pending, body: bytes, seq: int) -> None:
        reached, refused, durable = self.server.publish(
            pending.exchange,
            pending.routing_key,
            pending.properties,
            body,
        )
        if not reached and pending.mandatory and not refused:
            self.send(
                encode_return(
                    channel.number,
                    ReplyCode.NO_ROUTE,
                    b"NO_ROUTE",
                    pending.exchange.encode(),
                    pending.routing_key.encode(),
                    pending.properties,
                    body,
                    self.frame_max,
                )
            )
        if not seq:
            return
        if refused:
            self.send(encode_nack(channel.number, seq, False))
        elif durable and self.manager.persistence is not None:
            self._await_durable(channel, seq)
        else:
            self._confirms.setdefault(channel, []).append(seq)

    def _await_durable(self, channel: Channel, seq: int) -> None:
        persistence = self.manager.persistence
        assert persistence is not None
        if self._durable_batch is None or self._durable_epoch != persistence.epoch:
            batch: list[tuple[Channel, int]] = []
            self._durable_batch = batch
            self._durable_epoch = persistence.epoch
            persistence.when_durable(lambda err: self._durable_done(batch, err))
        self._durable_batch.append((channel, seq))

    def _durable_done(self, batch: list[tuple[Channel, int]], err: Exception | None) -> None:
        if batch is self._durable_batch:
            self._durable_batch = None
        if self.state is not State.OPEN:
            return
        by_channel: dict[Channel, list[int]] = {}
        for channel, seq in batch:
            if channel.closing or self.channels.get(channel.number) is not channel:
                continue
            by_channel.setdefault(channel, []).append(seq)
        for channel, seqs in by_channel.items():
            if err is None:
                self._send_confirms(channel, seqs)
            else:
                self.send(b"".join(encode_nack(channel.number, s, False) for s in seqs))

    def _send_confirms(self, channel: Channel, seqs: list[int]) -> None:
        """Acks for ``seqs``; a run that covers everything up to its last one is sent as one
        ack with ``multiple``."""
        if channel.closing or not seqs:
            return
        done = channel.confirmed_upto
        seqs.sort()
        if seqs[0] == done + 1 and seqs[-1] - seqs[0] == len(seqs) - 1:
            self.send(encode_ack(channel.number, seqs[-1], len(seqs) > 1))
            channel.confirmed_upto = seqs[-1]
        else:
            self.send(b"".join(encode_ack(channel.number, s, False) for s in seqs))

    def b_get(self, channel: Channel, method: commands.Basic.Get) -> None:
        name = self._queue_name(channel, text(method.queue))
        self._check_exclusive(channel, name, 60, 70)
        queue = self.manager.queues.get(name)
        if queue is None or name.startswith("$"):
            raise AmqpError(
                ReplyCode.NOT_FOUND,
                f"NOT_FOUND - no queue '{name}' in vhost '/'",
                channel.number,
                60,
                70,
            )
        entry = channel.getters.get(name)
        if entry is None or entry[0].queue.deleted:
            getter = _Getter()
            sub = self.manager.subscribe(
                name, f"get-{channel.number}", getter, UNLIMITED, dispatch=False
            )
            entry = channel.getters[name] = (sub, getter)
        sub, getter = entry
        self.server.touch(name)
        msg = self.manager.take(sub)
        if msg is None:
            self.send(encode_method(channel.number, commands.Basic.GetEmpty()))
            return
        tag = channel.next_tag
        channel.next_tag += 1
        if method.no_ack:
            self.manager.ack(sub, msg.id, dispatch=False)
        else:
            channel.unacked[tag] = (sub, msg.id)
        properties, body = self.server.mapper.from_core(msg.payload, msg.headers)
        exchange, routing_key = self.server.mapper.origin(msg.headers, name)
        self.send(
            encode_get_ok(
                channel.number,
                tag,
                msg.attempts > 1,
                exchange.encode(),
                routing_key.encode(),
                queue.message_count,
                properties,
                body,
                self.frame_max,
            )
        )

    def b_ack(self, channel: Channel, method: Any) -> None:
        tag, multiple = method.delivery_tag, bool(method.multiple)
        if channel.tx is not None:
            channel._tags_for(tag, multiple)  # unknown tags fail now, not at commit
            channel.tx.append(lambda: self._refill.update(channel.ack(tag, multiple)))
            return
        self._refill |= channel.ack(tag, multiple)

    def b_nack(self, channel: Channel, method: Any) -> None:
        tag, multiple, requeue = method.delivery_tag, bool(method.multiple), bool(method.requeue)
        if channel.tx is not None:
            channel._tags_for(tag, multiple)
            channel.tx.append(lambda: self._refill.update(channel.nack(tag, multiple, requeue)))
            return
        self._refill |= channel.nack(tag, multiple, requeue)

    def b_reject(self, channel: Channel, method: Any) -> None:
        tag, requeue = method.delivery_tag, bool(method.requeue)
        if channel.tx is not None:
            channel._tags_for(tag, False)
            channel.tx.append(lambda: self._refill.update(channel.nack(tag, False, requeue)))
            return
        self._refill |= channel.nack(tag, False, requeue)

    def b_recover(self, channel: Channel, method: Any) -> None:
        self._refill |= channel.recover()
        if isinstance(method, commands.Basic.Recover):
            self.send(encode_method(channel.number, commands.Basic.RecoverOk()))

    # confirms and transactions

    def c_select(self, channel: Channel, method: commands.Confirm.Select) -> None:
        if channel.tx is not None:
            raise AmqpError(
                ReplyCode.PRECONDITION_FAILED,
                "PRECONDITION_FAILED - cannot switch from tx to confirm mode",
                channel.number,
                85,
                10,
            )
        channel.confirm = True
        if not method.nowait:
            self.send(encode_method(channel.number, commands.Confirm.SelectOk()))

    def tx_select(self, channel: Channel, method: commands.Tx.Select) -> None:
        if channel.confirm:
            raise AmqpError(
                ReplyCode.PRECONDITION_FAILED,
                "PRECONDITION_FAILED - cannot switch from confirm to tx mode",
                channel.number,
                90,
                10,
            )
        if channel.tx is None:
            channel.tx = []
        self.send(encode_method(channel.number, commands.Tx.SelectOk()))

    def tx_commit(self, channel: Channel, method: commands.Tx.Commit) -> None:
        if channel.tx is None:
            raise AmqpError(
                ReplyCode.PRECONDITION_FAILED,
                "PRECONDITION_FAILED - channel is not transactional",
                channel.number,
                90,
                20,
            )
        work, channel.tx = channel.tx, []
        for step in work:
            step()
        self.send(encode_method(channel.number, commands.Tx.CommitOk()))

    def tx_rollback(self, channel: Channel, method: commands.Tx.Rollback) -> None:
        if channel.tx is None:
            raise AmqpError(
                ReplyCode.PRECONDITION_FAILED,
                "PRECONDITION_FAILED - channel is not transactional",
                channel.number,
                90,
                30,
            )
        channel.tx = []
        self.send(encode_method(channel.number, commands.Tx.RollbackOk()))

    def _exchanges(self) -> Any:
        exchanges = self.server.exchanges
        assert exchanges is not None
        return exchanges


def _ids_of(method: PamqpFrame) -> tuple[int, int]:
    index = getattr(method, "index", 0) or 0
    return index >> 16, index & 0xFFFF


_FRAME_HANDLERS: dict[type, Callable[[AmqpConnection, Any], None]] = {
    ProtocolHeader: AmqpConnection.on_protocol_header,
    MethodFrame: AmqpConnection.on_method,
    HeaderFrame: AmqpConnection.on_header,
    BodyFrame: AmqpConnection.on_body,
    Heartbeat: AmqpConnection.on_heartbeat,
}

_CONNECTION_HANDLERS: dict[type, Callable[[AmqpConnection, Any], None]] = {
    commands.Connection.StartOk: AmqpConnection.on_start_ok,
    commands.Connection.TuneOk: AmqpConnection.on_tune_ok,
    commands.Connection.Open: AmqpConnection.on_open,
    commands.Connection.Close: AmqpConnection.on_close,
    commands.Connection.CloseOk: AmqpConnection.on_close_ok,
}

_CHANNEL_HANDLERS: dict[type, Callable[[AmqpConnection, Channel, Any], None]] = {
    commands.Channel.Open: AmqpConnection.ch_open,
    commands.Channel.Close: AmqpConnection.ch_close,
    commands.Channel.CloseOk: AmqpConnection.ch_close_ok,
    commands.Channel.Flow: AmqpConnection.ch_flow,
    commands.Channel.FlowOk: AmqpConnection.ch_flow_ok,
    commands.Exchange.Declare: AmqpConnection.ex_declare,
    commands.Exchange.Delete: AmqpConnection.ex_delete,
    commands.Exchange.Bind: AmqpConnection.ex_bind,
    commands.Exchange.Unbind: AmqpConnection.ex_unbind,
    commands.Queue.Declare: AmqpConnection.q_declare,
    commands.Queue.Bind: AmqpConnection.q_bind,
    commands.Queue.Unbind: AmqpConnection.q_unbind,
    commands.Queue.Purge: AmqpConnection.q_purge,
    commands.Queue.Delete: AmqpConnection.q_delete,
    commands.Basic.Qos: AmqpConnection.b_qos,
    commands.Basic.Consume: AmqpConnection.b_consume,
    commands.Basic.Cancel: AmqpConnection.b_cancel,
    commands.Basic.Publish: AmqpConnection.b_publish,
    commands.Basic.Get: AmqpConnection.b_get,
    commands.Basic.Ack: AmqpConnection.b_ack,
    commands.Basic.Nack: AmqpConnection.b_nack,
    commands.Basic.Reject: AmqpConnection.b_reject,
    commands.Basic.Recover: AmqpConnection.b_recover,
    commands.Basic.RecoverAsync: AmqpConnection.b_recover,
    commands.Confirm.Select: AmqpConnection.c_select,
    commands.Tx.Select: AmqpConnection.tx_select,
    commands.Tx.Commit: AmqpConnection.tx_commit,
    commands.Tx.Rollback: AmqpConnection.tx_rollback,
}
