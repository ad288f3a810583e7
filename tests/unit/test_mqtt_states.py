"""The MQTT adapter's structure: the state table, the handlers it dispatches to, and the
layering of its modules (imports one way only, the connection free of asyncio)."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

import vibemq_server.adapters.mqtt as mqtt_package
from vibemq_server.adapters.mqtt import connection
from vibemq_server.adapters.mqtt.packets import Connack, Pingresp, Suback, Unsuback
from vibemq_server.adapters.mqtt.states import RUNNING, TRANSITIONS, Event, State

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


def _imports(path: Path) -> set[str]:
    """The modules of the package that ``path`` imports, TYPE_CHECKING blocks included."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == PACKAGE:
                found.update(f"{PACKAGE}.{alias.name}" for alias in node.names)
            elif node.module.startswith(PACKAGE + "."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith(PACKAGE + "."))
    return found


def _modules() -> dict[str, Path]:
    root = Path(mqtt_package.__file__).parent
    return {f"{PACKAGE}.{p.stem}": p for p in root.glob("*.py") if p.stem != "__init__"}


def test_the_modules_import_each_other_one_way() -> None:
    modules = _modules()
    graph = {name: _imports(path) & set(modules) for name, path in modules.items()}
    try:
        list(TopologicalSorter(graph).static_order())
    except CycleError as exc:  # pragma: no cover - the failure message
        pytest.fail(f"import cycle: {exc.args[1]}")


@pytest.mark.parametrize("module", ["codec", "states", "session", "connection"])
def test_the_sans_io_layers_import_no_asyncio(module: str) -> None:
    tree = ast.parse(_modules()[f"{PACKAGE}.{module}"].read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {n for n in names if n.split(".")[0] in {"asyncio", "uvloop", "socket"}}
