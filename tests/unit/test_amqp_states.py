"""The AMQP adapter's structure: the state tables, the handlers they dispatch to, and the
layering of its modules (imports one way only, the session free of asyncio)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from adapterlayers import io_imports, modules, one_way_graph
from pamqp import commands

import vibemq_server.adapters.amqp as amqp_package
from vibemq_server.adapters.amqp import connection
from vibemq_server.adapters.amqp.codec import BodyFrame, HeaderFrame, ProtocolHeader, PublishTriple
from vibemq_server.adapters.amqp.states import (
    CHANNEL_TRANSITIONS,
    RUNNING,
    TRANSITIONS,
    ChannelState,
    Event,
    Input,
    State,
)

PACKAGE = "vibemq_server.adapters.amqp"
ENDINGS = (Event.REFUSED, Event.TIMED_OUT, Event.LOST)


def _inputs(rows: Mapping[Any, Mapping[Input, Any]]) -> set[Input]:
    """Every frame or method type some state of ``rows`` accepts (the events left out)."""
    return {i for row in rows.values() for i in row if not isinstance(i, Event)}


def test_every_accepted_connection_input_has_a_handler() -> None:
    accepted = _inputs(TRANSITIONS)
    assert accepted == {ProtocolHeader, *connection._CONNECTION_HANDLERS}
    # Only methods a client sends on channel 0.
    assert accepted - {ProtocolHeader} <= {
        commands.Connection.StartOk,
        commands.Connection.TuneOk,
        commands.Connection.Open,
        commands.Connection.Close,
        commands.Connection.CloseOk,
        commands.Connection.UpdateSecret,
    }


def test_every_accepted_channel_method_has_a_handler_and_every_handler_a_state() -> None:
    accepted = _inputs(CHANNEL_TRANSITIONS) - {HeaderFrame, BodyFrame, PublishTriple}
    assert accepted == set(connection._CHANNEL_HANDLERS)
    # basic.publish is the one method that waits for content.
    open_row = CHANNEL_TRANSITIONS[ChannelState.OPEN]
    assert [m for m, s in open_row.items() if s is ChannelState.AWAIT_CONTENT] == [
        commands.Basic.Publish
    ]
    # A channel waiting for content takes content frames only.
    waiting = CHANNEL_TRANSITIONS[ChannelState.AWAIT_CONTENT]
    assert {i for i in waiting if not isinstance(i, Event)} == {HeaderFrame, BodyFrame}
    assert waiting[Event.CONTENT_DONE] is ChannelState.OPEN
    # A publish read whole with its content goes through AWAIT_CONTENT and back: only an
    # open channel takes it in one step (else it is handled as its three frames).
    assert [s for s, row in CHANNEL_TRANSITIONS.items() if PublishTriple in row] == [
        ChannelState.OPEN
    ]
    assert open_row[PublishTriple] is waiting[Event.CONTENT_DONE]


def test_every_state_has_a_row_and_ending_always_ends_closed() -> None:
    assert set(TRANSITIONS) == set(State)
    for state, row in TRANSITIONS.items():
        for event in ENDINGS:
            assert row[event] is State.CLOSED, (state, event)
    assert not [i for i in TRANSITIONS[State.CLOSED] if not isinstance(i, Event)]
    assert State.CLOSED not in RUNNING
    # An error once the header is in sends connection.close and waits for close-ok.
    for state in RUNNING - {State.AWAIT_HEADER, State.CLOSING}:
        assert TRANSITIONS[state][Event.CLOSE_SENT] is State.CLOSING
    closing = TRANSITIONS[State.CLOSING]
    assert {i for i in closing if not isinstance(i, Event)} == {
        commands.Connection.Close,
        commands.Connection.CloseOk,
    }
    assert set(CHANNEL_TRANSITIONS) == set(ChannelState)
    assert not CHANNEL_TRANSITIONS[ChannelState.CLOSED]


def test_the_modules_import_each_other_one_way() -> None:
    graph = one_way_graph(amqp_package)
    # Nothing of the session knows the server: it uses base.Server.
    session = {"channel", "states", "base", "handshake", "declarations", "basic", "connection"}
    for module in session:
        assert f"{PACKAGE}.server" not in graph[f"{PACKAGE}.{module}"], module


@pytest.mark.parametrize(
    "module",
    ["codec", "states", "channel", "base", "handshake", "declarations", "basic", "connection"],
)
def test_the_sans_io_layers_import_no_asyncio(module: str) -> None:
    assert not io_imports(modules(amqp_package)[f"{PACKAGE}.{module}"])
