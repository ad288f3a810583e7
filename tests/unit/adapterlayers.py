"""What the adapters' structure tests (test_mqtt_states, test_amqp_states) read of a package's
source: its modules, the imports among them (TYPE_CHECKING blocks included), and which
event-loop or socket modules a module imports."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path
from types import ModuleType

import pytest

_IO_MODULES = {"asyncio", "uvloop", "socket"}


def _imports(package: str, path: Path) -> set[str]:
    """The modules of ``package`` that ``path`` imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == package:
                found.update(f"{package}.{alias.name}" for alias in node.names)
            elif node.module.startswith(package + "."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith(package + "."))
    return found


def modules(package: ModuleType) -> dict[str, Path]:
    """The package's modules (``__init__`` left out) by dotted name."""
    root = Path(package.__file__ or "").parent
    name = package.__name__
    return {f"{name}.{p.stem}": p for p in root.glob("*.py") if p.stem != "__init__"}


def one_way_graph(package: ModuleType) -> dict[str, set[str]]:
    """Which of the package's modules each imports; fails the test on a cycle."""
    found = modules(package)
    graph = {name: _imports(package.__name__, path) & set(found) for name, path in found.items()}
    try:
        list(TopologicalSorter(graph).static_order())
    except CycleError as exc:  # pragma: no cover - the failure message
        pytest.fail(f"import cycle: {exc.args[1]}")
    return graph


def io_imports(path: Path) -> set[str]:
    """The event-loop and socket modules ``path`` imports (none, for a sans-IO layer)."""
    tree = ast.parse(path.read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    return {n for n in names if n.split(".")[0] in _IO_MODULES}
