"""One AMQP 0-9-1 connection, sans-IO: bytes in, frames handled, bytes out through a ``Link``.

``AmqpConnection`` is the ``Session`` that the shared ``StreamTransport`` drives (see
vibemq_server/server/transport.py): it owns no socket and no event loop. It turns the bytes it
is given into frames (``codec.FrameParser``), moves the connection and its channels through
the tables of ``states.py`` and hands each method to its handler: channel 0's to
``_CONNECTION_HANDLERS`` (handshake.py), a channel's to ``_CHANNEL_HANDLERS`` (the channel
methods here, declarations.py, basic.py). What it answers goes to ``Link.send``.

Errors are RabbitMQ's: a channel-level one (404, 405, 406, 403) closes that channel with
channel.close; a connection-level one (501..541) closes the connection with
connection.close. The reply text says what was wrong. A core error raised by a handler maps
onto its reply code (``_CORE_ERRORS``).

Flow control: a consumer is fed only while the link is ``writable``; when it drains
(``writable_again``) the consumers' queues dispatch again. Over the memory high watermark a
connection that publishes stops being read (connection.blocked when the client understands
it). What acks and new consumers free is dispatched once, when the read is done.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pamqp import commands
from pamqp.base import Frame as PamqpFrame

from vibemq_server.adapters.amqp.base import NOTHING_HELD, NOTHING_TO_REFILL
from vibemq_server.adapters.amqp.basic import BasicMethods
from vibemq_server.adapters.amqp.channel import UNLIMITED, Channel
from vibemq_server.adapters.amqp.codec import (
    HEARTBEAT,
    AmqpError,
    BodyFrame,
    Frame,
    HeaderFrame,
    Heartbeat,
    MethodFrame,
    ProtocolHeader,
    PublishTriple,
    ReplyCode,
    encode_method,
    text,
)
from vibemq_server.adapters.amqp.handshake import AUTH_FAILURE_DELAY_S
from vibemq_server.adapters.amqp.permissions import check as check_access
from vibemq_server.adapters.amqp.states import CHANNEL_TRANSITIONS, ChannelState, Event, State
from vibemq_server.core import CoreError, QueueExists, QueueNotFound
from vibemq_server.core.exchanges import (
    ExchangeAccessRefused,
    ExchangeInUse,
    ExchangeMismatch,
    ExchangeNotFound,
    InvalidExchangeType,
)
from vibemq_server.server.transport import ConsumerInfo, Detail, SessionInfo

_CORE_ERRORS: dict[type[Exception], ReplyCode] = {
    QueueNotFound: ReplyCode.NOT_FOUND,
    ExchangeNotFound: ReplyCode.NOT_FOUND,
    QueueExists: ReplyCode.PRECONDITION_FAILED,
    ExchangeMismatch: ReplyCode.PRECONDITION_FAILED,
    ExchangeInUse: ReplyCode.PRECONDITION_FAILED,
    ExchangeAccessRefused: ReplyCode.ACCESS_REFUSED,
    InvalidExchangeType: ReplyCode.COMMAND_INVALID,  # closes the connection, as in RabbitMQ
}

_OPEN = State.OPEN
_CLOSING = State.CLOSING
_CLOSED = State.CLOSED
_CHANNEL_CLOSING = ChannelState.CLOSING
_CHANNEL_AWAIT_CONTENT = ChannelState.AWAIT_CONTENT


#: the client properties an operator sees (RabbitMQ's management shows these)
_SHOWN_PROPERTIES = ("product", "version", "platform", "connection_name", "information")


def _error_name(code: int) -> str:
    try:
        return ReplyCode(code).name
    except ValueError:
        return "ERROR"


class AmqpConnection(BasicMethods):
    """Implements the transport's ``Session`` for one AMQP client: ``AmqpConnection(link,
    server)`` (``base.ConnectionBase`` holds its state)."""

    __slots__ = ()

    # -- input (Session) -----------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.state is _CLOSED:
            return
        self.last_rx = self.link.time()
        error: AmqpError | None = None
        try:
            frames = self.parser.feed(data)
        except AmqpError as exc:
            frames = list(exc.frames)
            error = exc
        if self.awaiting_login:  # (reading is paused for it; these were on their way)
            held, start, held_error = self._held_frames
            self._held_frames = (held + frames, start, held_error or error)
            return
        self._handle_frames(frames, 0, error)

    def _handle_frames(self, frames: list[Frame], start: int, error: AmqpError | None) -> None:
        for index in range(start, len(frames)):
            frame = frames[index]
            if self.state is _CLOSED:
                break
            try:
                _FRAME_HANDLERS[type(frame)](self, frame)
            except Exception as exc:
                self._frame_failed(frame, exc)
            if self.awaiting_login:
                # A password hash is verified off the loop: the rest waits for the verdict.
                self._held_frames = (frames, index + 1, error)
                return
        if error is not None and self.state is not _CLOSED:
            self.log.warning("malformed frame", code=int(error.code), error=error.text)
            self._fail(error)
        self._after_read()

    def _frame_failed(self, frame: Frame, exc: Exception) -> None:
        """What a handler raised, as the close it calls for."""
        if isinstance(exc, AmqpError):
            self._fail(exc)
        elif isinstance(exc, CoreError):
            code = _CORE_ERRORS.get(type(exc), ReplyCode.PRECONDITION_FAILED)
            channel = getattr(frame, "channel", 0)
            text = f"{_error_name(code)} - {exc}"
            ids = _ids_of(frame.method) if isinstance(frame, MethodFrame) else (0, 0)
            self._fail(AmqpError(code, text, channel, *ids))
        else:  # a bug must cost this connection only, never the broker
            self.log.exception("internal error handling a frame")
            self._fail(AmqpError(ReplyCode.INTERNAL_ERROR, "INTERNAL_ERROR", 0))

    def login_decided(self, decide: Callable[[], None]) -> None:
        """A login whose hash was verified off the loop: ``decide`` (accept or refuse), then the
        frames that came after it, unless the verdict closed or paused the connection."""
        self.awaiting_login = False
        held, self._held_frames = self._held_frames, NOTHING_HELD
        self.link.resume_reading()
        try:
            decide()
        except AmqpError as exc:
            self._fail(exc)
        if self.state is _CLOSED or self.link.reading_paused:
            return  # (a refused login pauses reading until it is answered)
        self._handle_frames(*held)

    def _after_read(self) -> None:
        """The end of a read: confirms, then the queues that acks and consumers freed, then
        the memory alarm."""
        if self._confirms:
            for channel, seqs in self._confirms.items():
                self._send_confirms(channel, seqs)
            self._confirms.clear()
        if self._refill:
            queues, self._refill = self._refill, NOTHING_TO_REFILL
            for name in queues:
                queue = self.manager.queues.get(name)
                if queue is not None:
                    queue.dispatch()
        published, self._published = self._published, False
        # Over the memory high watermark only connections that publish stop being read (as in
        # RabbitMQ): a consumer's acks, or a new connection, are what frees memory.
        link = self.link
        if published and self.manager.memory_blocked and not link.reading_paused:
            link.pause_reading()
            # Not once connection.close is out: nothing but close-ok may follow it (found
            # by tests/unit/test_amqp_session_fuzz.py).
            if self.capabilities.get("connection.blocked") and self.state is _OPEN:
                self.send(encode_method(0, commands.Connection.Blocked("memory high watermark")))
                self.blocked = True
            self.manager.wait_for_memory(self._memory_ok)

    def _memory_ok(self) -> None:
        if self.blocked:
            self.blocked = False
            if self.state is _OPEN:  # (as for connection.blocked, above)
                self.send(encode_method(0, commands.Connection.Unblocked()))
        self.link.resume_reading()

    # -- frames ------------------------------------------------------------------------------------

    def on_protocol_header_frame(self, frame: ProtocolHeader) -> None:
        if ProtocolHeader not in self._accepts:
            raise AmqpError(ReplyCode.FRAME_ERROR, "FRAME_ERROR - unexpected protocol header", 0)
        self._fire(ProtocolHeader)
        self.on_protocol_header(frame)

    def on_heartbeat(self, frame: Heartbeat) -> None:
        pass  # last_rx is updated for every read

    def on_method(self, frame: MethodFrame) -> None:
        method = frame.method
        kind = type(method)
        if frame.channel == 0:
            state = self.state
            if kind not in self._accepts:
                if state is _CLOSING:
                    return  # everything but close/close-ok is ignored now
                raise AmqpError(
                    ReplyCode.COMMAND_INVALID if state is _OPEN else ReplyCode.CHANNEL_ERROR,
                    f"COMMAND_INVALID - {method.name} not allowed on channel 0 "
                    f"in state {state.value}",
                    0,
                    *_ids_of(method),
                )
            self._fire(kind)
            _CONNECTION_HANDLERS[kind](self, method)
            return
        if self.state is not _OPEN:
            if self.state is _CLOSING:
                return
            raise AmqpError(
                ReplyCode.CHANNEL_ERROR,
                f"CHANNEL_ERROR - {method.name} before the connection is open",
                0,
                *_ids_of(method),
            )
        channel = self.channels.get(frame.channel)
        if channel is None:
            if kind is commands.Channel.Open:
                self.open_channel(frame.channel)
                return
            raise AmqpError(
                ReplyCode.CHANNEL_ERROR,
                f"CHANNEL_ERROR - expected 'channel.open' on channel {frame.channel}",
                0,
                *_ids_of(method),
            )
        channel_state = channel.state
        following = channel.accepts.get(kind)
        if channel_state is _CHANNEL_CLOSING:
            if following is not None:  # close or close-ok: the channel is gone
                if kind is commands.Channel.Close:
                    self.send(encode_method(channel.number, commands.Channel.CloseOk()))
                channel.fire(kind)
                del self.channels[channel.number]
            return  # everything else on a closing channel is dropped, as the spec says
        if following is None:
            if channel_state is _CHANNEL_AWAIT_CONTENT:
                raise AmqpError(
                    ReplyCode.UNEXPECTED_FRAME,
                    f"UNEXPECTED_FRAME - expected content on channel {channel.number}, got "
                    f"{method.name}",
                    0,
                    *_ids_of(method),
                )
            raise AmqpError(
                ReplyCode.COMMAND_INVALID,
                f"COMMAND_INVALID - unexpected {method.name} on channel {channel.number}",
                0,
                *_ids_of(method),
            )
        if not self.access.everything:
            check_access(self.access, method, channel.number, channel.last_queue, _ids_of(method))
        if following is not channel_state:
            channel.state = following
            channel.accepts = CHANNEL_TRANSITIONS[following]
        _CHANNEL_HANDLERS[kind](self, channel, method)

    def on_publish_triple(self, frame: PublishTriple) -> None:
        """A publish read whole with its content (the parser's ``PublishTriple``): routed at
        once on an open channel. Anything out of the ordinary (the connection or channel not
        simply open, a transaction, permissions to check, a missing or internal exchange, a
        body over the limit) takes the general path, as the three frames it stands for, so
        that every check and error stays in one place."""
        channel = self.channels.get(frame.channel)
        head = frame.head
        exchange = head.exchange
        if (
            channel is None
            or self.state is not _OPEN
            or channel.accepts.get(PublishTriple) is not channel.state
            or channel.tx is not None
            or not self.access.everything
            or len(frame.body) > self.max_message_size
            or (exchange and not self._plain_exchange(exchange))
        ):
            for part in frame.frames():
                if self.state is _CLOSED:
                    break
                try:
                    _FRAME_HANDLERS[type(part)](self, part)
                except Exception as exc:
                    self._frame_failed(part, exc)
            return
        self._published = True
        self.server.stats.messages_received += 1
        seq = 0
        if channel.confirm:
            seq = channel.publish_seq = channel.publish_seq + 1
        self._route(
            channel, exchange, head.routing_key, head.mandatory, head.properties, frame.body, seq
        )

    def on_header(self, frame: HeaderFrame) -> None:
        channel = self._content_channel(frame.channel)
        if channel is None:
            return
        if channel.content_header(frame.body_size, frame.properties, self.max_message_size):
            self._publish(channel)

    def on_body(self, frame: BodyFrame) -> None:
        channel = self._content_channel(frame.channel)
        if channel is None:
            return
        if channel.content_body(frame.data):
            self._publish(channel)

    def _content_channel(self, number: int) -> Channel | None:
        """The channel a content frame belongs to; None when it is to be dropped. Content
        outside basic.publish is refused by the channel (``content_header``/``_body``)."""
        if self.state is not _OPEN:
            if self.state is _CLOSING:
                return None
            raise AmqpError(ReplyCode.UNEXPECTED_FRAME, "UNEXPECTED_FRAME - content frame", 0)
        channel = self.channels.get(number)
        if channel is None:
            raise AmqpError(
                ReplyCode.CHANNEL_ERROR, f"CHANNEL_ERROR - channel {number} is not open", 0
            )
        if channel.state is _CHANNEL_CLOSING:
            return None
        return channel

    # -- errors ------------------------------------------------------------------------------------

    def _fail(self, exc: AmqpError) -> None:
        self.server.stats.error(_error_name(exc.code))
        if exc.fatal or exc.channel == 0:
            self.log.warning("connection error", code=int(exc.code), error=exc.text)
            self._close_connection(exc.code, exc.text, exc.class_id, exc.method_id)
            return
        channel = self.channels.get(exc.channel)
        if channel is None or channel.closing:
            return
        self.log.info("channel error", channel=exc.channel, code=int(exc.code), error=exc.text)
        self._flush_confirms(channel)
        self.to_refill().update(self._release_channel(channel))
        channel.fire(Event.CLOSE_SENT)
        self.send(
            encode_method(
                exc.channel,
                commands.Channel.Close(int(exc.code), exc.text[:255], exc.class_id, exc.method_id),
            )
        )

    def _close_connection(
        self, code: int, text: str, class_id: int = 0, method_id: int = 0
    ) -> None:
        if self.state is _CLOSING or self.state is _CLOSED:
            return
        if self.state is State.AWAIT_HEADER:
            self._fire(Event.REFUSED)
            self.link.close()
            return
        for confirm_channel in list(self._confirms):
            self._flush_confirms(confirm_channel)
        self.send(
            encode_method(0, commands.Connection.Close(int(code), text[:255], class_id, method_id))
        )
        self._fire(Event.CLOSE_SENT)
        self.closing_since = self.link.time()
        self._stop_deliveries()
        queues: set[str] = set()
        for channel in list(self.channels.values()):
            queues |= self._release_channel(channel)
        self.channels.clear()
        self.to_refill().update(queues)

    # -- the rest of Session -------------------------------------------------------------------

    def writable_again(self) -> None:
        for channel in list(self.channels.values()):
            for consumer in list(channel.consumers.values()):
                if consumer.sub is not None:
                    consumer.sub.queue.dispatch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fire(Event.LOST)
        self._release_all()

    def check_timers(self, now: float, keepalive: float, frame_timeout: float) -> None:
        state = self.state
        if state is _CLOSED:
            refused_at = self.refused_at
            if refused_at is not None and now - refused_at >= AUTH_FAILURE_DELAY_S:
                self.refused_at = None
                self.link.close()  # a refused login's socket, held back (handshake.py)
            return
        if state is _CLOSING:
            if now - self.closing_since > 2.0:
                self._fire(Event.TIMED_OUT)
                self.link.abort()  # no close-ok in time
            return
        if state is not _OPEN:
            if now - self.opened_at > self.server.cfg.handshake_timeout_s:
                self.log.info("handshake timed out", state=state.value)
                self._fire(Event.TIMED_OUT)
                self.link.abort()
            return
        if self.link.reading_paused:
            self.last_rx = now
        heartbeat = self.heartbeat
        if not heartbeat:
            return
        if now - self.last_rx > 2 * heartbeat:
            self.log.info("missed heartbeats; closing", idle_s=round(now - self.last_rx, 1))
            self._fire(Event.TIMED_OUT)
            self.link.abort()
            return
        if now - self.last_heartbeat_sent >= heartbeat / 2:
            self.last_heartbeat_sent = now
            self.send(HEARTBEAT)

    def shutdown(self, reason: str) -> None:
        """Broker shutdown: connection.close 320 CONNECTION_FORCED."""
        if self.state is _OPEN:
            self._close_connection(ReplyCode.CONNECTION_FORCED, "CONNECTION_FORCED - " + reason)
        else:
            self.link.close()

    def close_by_operator(self, reason: str) -> None:
        """As RabbitMQ's management: connection.close 320 ``CONNECTION_FORCED - <reason>``."""
        self.log.info("connection closed by operator", reason=reason)
        self.shutdown(reason)

    def describe(self) -> SessionInfo:
        props = {k: text(v) for k, v in self.client_properties.items() if k in _SHOWN_PROPERTIES}
        named = [props[k] for k in ("product", "connection_name") if props.get(k)]
        consumers = tuple(
            ConsumerInfo(
                consumer.queue,
                tag,
                0 if consumer.sub.prefetch >= UNLIMITED else consumer.sub.prefetch,
                consumer.sub.n_held,
                number,
            )
            for number, channel in self.channels.items()
            for tag, consumer in channel.consumers.items()
            if consumer.sub is not None
        )
        details: dict[str, Detail] = {
            **props,
            "heartbeat_s": self.heartbeat,
            "frame_max": self.frame_max,
            "channel_max": self.channel_max,
        }
        return SessionInfo(
            "amqp",
            self.user,
            " / ".join(named) or None,
            self.state.value,
            channels=len(self.channels),
            consumers=consumers,
            details=details,
        )

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
        self.to_refill().update(self._release_channel(channel))
        del self.channels[channel.number]
        self.send(encode_method(channel.number, commands.Channel.CloseOk()))

    def ch_close_ok(self, channel: Channel, method: commands.Channel.CloseOk) -> None:
        pass  # only meaningful while closing (handled before dispatch)

    def ch_flow(self, channel: Channel, method: commands.Channel.Flow) -> None:
        channel.flow = bool(method.active)
        self.send(encode_method(channel.number, commands.Channel.FlowOk(active=channel.flow)))
        if channel.flow:
            for consumer in channel.consumers.values():
                self.to_refill().add(consumer.queue)

    def ch_flow_ok(self, channel: Channel, method: commands.Channel.FlowOk) -> None:
        pass


def _ids_of(method: PamqpFrame) -> tuple[int, int]:
    index = getattr(method, "index", 0) or 0
    return index >> 16, index & 0xFFFF


#: The handler of each kind of frame.
_FRAME_HANDLERS: dict[type, Callable[[AmqpConnection, Any], None]] = {
    ProtocolHeader: AmqpConnection.on_protocol_header_frame,
    MethodFrame: AmqpConnection.on_method,
    HeaderFrame: AmqpConnection.on_header,
    BodyFrame: AmqpConnection.on_body,
    Heartbeat: AmqpConnection.on_heartbeat,
    PublishTriple: AmqpConnection.on_publish_triple,
}

#: The handler of each method on channel 0; which state accepts which is in TRANSITIONS.
_CONNECTION_HANDLERS: dict[type, Callable[[AmqpConnection, Any], None]] = {
    commands.Connection.StartOk: AmqpConnection.on_start_ok,
    commands.Connection.TuneOk: AmqpConnection.on_tune_ok,
    commands.Connection.Open: AmqpConnection.on_open,
    commands.Connection.Close: AmqpConnection.on_close,
    commands.Connection.CloseOk: AmqpConnection.on_close_ok,
    commands.Connection.UpdateSecret: AmqpConnection.on_update_secret,
}

#: The handler of each method on an open channel; which channel state accepts which is in
#: CHANNEL_TRANSITIONS (channel.close while closing is answered in on_method).
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
