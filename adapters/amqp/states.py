"""The AMQP 0-9-1 state machines of a connection and of its channels, as one table each (in
the style of h11's ``_state.py``): the only place that says which input each state accepts
and which state follows.

A connection goes through the handshake (protocol header, start/start-ok, tune/tune-ok,
open/open-ok) to ``OPEN``; a connection error (connection.close sent by us) moves it to
``CLOSING``, where only close / close-ok count. Its inputs are the protocol header, the
methods on channel 0 and the ``Event`` s the session decides on. Once it is open, each channel
is ``OPEN`` (methods), ``AWAIT_CONTENT`` (basic.publish seen: its content header and body
come next) or ``CLOSING`` (a channel error: we sent channel.close).

What an input not in a state's row means is the session's to say (connection.py): a method
the connection's state does not accept is 503 COMMAND_INVALID once open and 504
CHANNEL_ERROR before; a method on a channel waiting for content is 505 UNEXPECTED_FRAME;
anything but close / close-ok while closing is dropped, as the spec says. An event missing
from a row is a bug and raises ``KeyError``.
"""

from __future__ import annotations

from enum import Enum

from pamqp import commands

from vibemq_server.adapters.amqp.codec import BodyFrame, HeaderFrame, ProtocolHeader, PublishTriple


class _Fast(Enum):
    """An Enum hashed by identity (its members are singletons): Enum's own ``__hash__`` is a
    Python call per table lookup, and a channel moves twice per publish."""

    __hash__ = object.__hash__


class State(_Fast):
    AWAIT_HEADER = "await_header"
    AWAIT_START_OK = "await_start_ok"
    AWAIT_TUNE_OK = "await_tune_ok"
    AWAIT_OPEN = "await_open"
    OPEN = "open"
    CLOSING = "closing"  # we sent connection.close; only close/close-ok count now
    CLOSED = "closed"


class ChannelState(_Fast):
    OPEN = "open"
    AWAIT_CONTENT = "await_content"  # basic.publish seen: content header and body next
    CLOSING = "closing"  # we sent channel.close; only close/close-ok count now
    CLOSED = "closed"  # forgotten by its connection


class Event(_Fast):
    #: the wrong protocol header (answered with ours), or a connection error before it:
    #: the socket closes without connection.close
    REFUSED = "refused"
    #: an error (or the broker's shutdown) made us send connection.close / channel.close
    CLOSE_SENT = "close_sent"
    #: the content of a basic.publish is complete
    CONTENT_DONE = "content_done"
    #: no handshake, heartbeat or close-ok in time: the socket is aborted
    TIMED_OUT = "timed_out"
    #: the socket is gone
    LOST = "lost"


Input = type | Event

_ENDINGS: dict[Input, State] = {
    Event.REFUSED: State.CLOSED,
    Event.TIMED_OUT: State.CLOSED,
    Event.LOST: State.CLOSED,
}
_ERRORS: dict[Input, State] = {Event.CLOSE_SENT: State.CLOSING, **_ENDINGS}

#: connection state -> {input (protocol header, channel-0 method, event) -> next state}
TRANSITIONS: dict[State, dict[Input, State]] = {
    State.AWAIT_HEADER: {ProtocolHeader: State.AWAIT_START_OK, **_ENDINGS},
    State.AWAIT_START_OK: {commands.Connection.StartOk: State.AWAIT_TUNE_OK, **_ERRORS},
    State.AWAIT_TUNE_OK: {commands.Connection.TuneOk: State.AWAIT_OPEN, **_ERRORS},
    State.AWAIT_OPEN: {
        commands.Connection.Open: State.OPEN,
        commands.Connection.Close: State.CLOSED,
        **_ERRORS,
    },
    State.OPEN: {
        commands.Connection.Close: State.CLOSED,
        commands.Connection.CloseOk: State.CLOSED,
        commands.Connection.UpdateSecret: State.OPEN,
        **_ERRORS,
    },
    State.CLOSING: {
        commands.Connection.Close: State.CLOSED,
        commands.Connection.CloseOk: State.CLOSED,
        **_ENDINGS,
    },
    # Closing twice (a timeout racing the socket's loss) changes nothing.
    State.CLOSED: dict(_ENDINGS),
}

#: The methods an open channel accepts (each has its handler in connection.py).
_CHANNEL_METHODS: tuple[type, ...] = (
    commands.Channel.Open,  # a second one: 504 CHANNEL_ERROR (its handler says so)
    commands.Channel.Flow,
    commands.Channel.FlowOk,
    commands.Channel.CloseOk,
    commands.Exchange.Declare,
    commands.Exchange.Delete,
    commands.Exchange.Bind,
    commands.Exchange.Unbind,
    commands.Queue.Declare,
    commands.Queue.Bind,
    commands.Queue.Unbind,
    commands.Queue.Purge,
    commands.Queue.Delete,
    commands.Basic.Qos,
    commands.Basic.Consume,
    commands.Basic.Cancel,
    commands.Basic.Get,
    commands.Basic.Ack,
    commands.Basic.Nack,
    commands.Basic.Reject,
    commands.Basic.Recover,
    commands.Basic.RecoverAsync,
    commands.Confirm.Select,
    commands.Tx.Select,
    commands.Tx.Commit,
    commands.Tx.Rollback,
)

#: channel state -> {input (method, content frame, event) -> next state}
CHANNEL_TRANSITIONS: dict[ChannelState, dict[Input, ChannelState]] = {
    ChannelState.OPEN: {
        **dict.fromkeys(_CHANNEL_METHODS, ChannelState.OPEN),
        commands.Basic.Publish: ChannelState.AWAIT_CONTENT,
        # basic.publish with its whole content in one read: through AWAIT_CONTENT and back
        PublishTriple: ChannelState.OPEN,
        commands.Channel.Close: ChannelState.CLOSED,
        Event.CLOSE_SENT: ChannelState.CLOSING,
    },
    ChannelState.AWAIT_CONTENT: {
        HeaderFrame: ChannelState.AWAIT_CONTENT,
        BodyFrame: ChannelState.AWAIT_CONTENT,
        Event.CONTENT_DONE: ChannelState.OPEN,
        Event.CLOSE_SENT: ChannelState.CLOSING,
    },
    ChannelState.CLOSING: {
        commands.Channel.Close: ChannelState.CLOSED,  # answered with close-ok
        commands.Channel.CloseOk: ChannelState.CLOSED,
    },
    ChannelState.CLOSED: {},
}

#: The connection states in which frames are still read and handled.
RUNNING = frozenset(
    {
        State.AWAIT_HEADER,
        State.AWAIT_START_OK,
        State.AWAIT_TUNE_OK,
        State.AWAIT_OPEN,
        State.OPEN,
        State.CLOSING,
    }
)
