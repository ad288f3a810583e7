"""The MQTT adapter's structure: the state table, the handlers it dispatches to, and the
layering of its modules (imports one way only, the connection free of asyncio)."""

from __future__ import annotations

import pytest
from adapterlayers import io_imports, modules, one_way_graph

import vibemq_server.adapters.mqtt as mqtt_package
from vibemq_server.adapters.mqtt import connection, connection5
from vibemq_server.adapters.mqtt.packets import Connack, Pingresp, Suback, Unsuback
from vibemq_server.adapters.mqtt.packets5 import Connack5, Suback5, Unsuback5
from vibemq_server.adapters.mqtt.states import RUNNING, TRANSITIONS, TRANSITIONS5, Event, State

PACKAGE = "vibemq_server.adapters.mqtt"
SERVER_TO_CLIENT = {Connack, Suback, Unsuback, Pingresp}


def test_every_accepted_packet_has_a_handler_and_every_handler_a_state() -> None:
    accepted = {i for row in TRANSITIONS.values() for i in row if not isinstance(i, Event)}
    assert accepted == set(connection._HANDLERS)
    assert not accepted & SERVER_TO_CLIENT


def test_every_state_has_a_row_and_closing_always_ends_closed() -> None:
    assert set(TRANSITIONS) == set(State)
    for state, row in TRANSITIONS.items():
        for event in (Event.DROPPED, Event.SHUTDOWN, Event.LOST):
            assert row[event] is State.CLOSED, (state, event)
    assert not [i for i in TRANSITIONS[State.CLOSED] if not isinstance(i, Event)]
    assert State.CLOSED not in RUNNING


def test_the_modules_import_each_other_one_way() -> None:
    one_way_graph(mqtt_package)  # fails the test on a cycle


def test_v5_every_accepted_packet_has_a_handler_and_closing_ends_closed() -> None:
    accepted = {i for row in TRANSITIONS5.values() for i in row if not isinstance(i, Event)}
    assert accepted == set(connection5._HANDLERS5)
    assert not accepted & {Connack5, Suback5, Unsuback5, Pingresp}
    assert set(TRANSITIONS5) == set(State)
    for state, row in TRANSITIONS5.items():
        for event in (Event.DROPPED, Event.SHUTDOWN, Event.LOST):
            assert row[event] is State.CLOSED, (state, event)


@pytest.mark.parametrize(
    "module",
    [
        "codec",
        "codec5",
        "states",
        "session",
        "session5",
        "message5",
        "connection",
        "connection5",
    ],
)
def test_the_sans_io_layers_import_no_asyncio(module: str) -> None:
    assert not io_imports(modules(mqtt_package)[f"{PACKAGE}.{module}"])
