"""The MQTT connection state machine, as one table (in the style of h11's ``_state.py``).

A connection is in one of three states. What moves it is either a packet from the client or an
``Event`` (what the broker decided, or what happened to the socket). ``TRANSITIONS`` lists, for
each state, every input it accepts and the state that follows; it is the only place that says
so. A packet type missing from a state's row is a protocol violation (the connection closes,
3.1.1 section 4.8); an event missing from it is a bug and raises ``KeyError``.
"""

from __future__ import annotations

from enum import Enum

from vibemq_server.adapters.mqtt.packets import (
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Subscribe,
    Unsubscribe,
)
from vibemq_server.adapters.mqtt.packets5 import (
    Auth5,
    Connect5,
    Disconnect5,
    Packet5,
    Puback5,
    Pubcomp5,
    Publish5,
    Pubrec5,
    Pubrel5,
    Subscribe5,
    Unsubscribe5,
)


class State(Enum):
    AWAIT_CONNECT = "await_connect"
    CONNECTED = "connected"
    CLOSED = "closed"


class Event(Enum):
    #: CONNECT accepted (CONNACK 0 sent)
    ACCEPTED = "accepted"
    #: CONNECT refused (CONNACK with an error code sent)
    REFUSED = "refused"
    #: closed because of the client: a violation, a malformed packet, a timeout, a takeover,
    #: a journal failure; the will goes out
    DROPPED = "dropped"
    #: broker shutdown: MQTT 3.1.1 has no server DISCONNECT, the socket just closes (no will)
    SHUTDOWN = "shutdown"
    #: the socket is gone
    LOST = "lost"


Input = type[Packet] | type[Packet5] | Event

_ENDINGS: dict[Input, State] = {
    Event.DROPPED: State.CLOSED,
    Event.SHUTDOWN: State.CLOSED,
    Event.LOST: State.CLOSED,
}

#: state -> {input -> next state}
TRANSITIONS: dict[State, dict[Input, State]] = {
    State.AWAIT_CONNECT: {
        # The CONNECT handler decides between ACCEPTED and REFUSED.
        Connect: State.AWAIT_CONNECT,
        Event.ACCEPTED: State.CONNECTED,
        Event.REFUSED: State.CLOSED,
        **_ENDINGS,
    },
    State.CONNECTED: {
        Publish: State.CONNECTED,
        Puback: State.CONNECTED,
        Pubrec: State.CONNECTED,
        Pubrel: State.CONNECTED,
        Pubcomp: State.CONNECTED,
        Subscribe: State.CONNECTED,
        Unsubscribe: State.CONNECTED,
        Pingreq: State.CONNECTED,
        Disconnect: State.CLOSED,
        **_ENDINGS,
    },
    # Closing twice (a drop racing the socket's loss, a shutdown) changes nothing.
    State.CLOSED: dict(_ENDINGS),
}

#: The states in which input is still read and handled.
RUNNING = frozenset({State.AWAIT_CONNECT, State.CONNECTED})

#: MQTT 5.0: the same states, its own packet classes (and AUTH, which the handler refuses:
#: no enhanced authentication was started).
TRANSITIONS5: dict[State, dict[Input, State]] = {
    State.AWAIT_CONNECT: {
        Connect5: State.AWAIT_CONNECT,
        Event.ACCEPTED: State.CONNECTED,
        Event.REFUSED: State.CLOSED,
        **_ENDINGS,
    },
    State.CONNECTED: {
        Publish5: State.CONNECTED,
        Puback5: State.CONNECTED,
        Pubrec5: State.CONNECTED,
        Pubrel5: State.CONNECTED,
        Pubcomp5: State.CONNECTED,
        Subscribe5: State.CONNECTED,
        Unsubscribe5: State.CONNECTED,
        Pingreq: State.CONNECTED,
        Auth5: State.CONNECTED,
        Disconnect5: State.CLOSED,
        **_ENDINGS,
    },
    State.CLOSED: dict(_ENDINGS),
}
