"""The package's import graph has no cycle, and nothing imports the top-level ``adapters``.

Every module of ``vibemq_server`` (the adapters included, through the ``vibemq_server/adapters``
symlink) is parsed with ``ast``; every import counts wherever it is written: at the top, inside
a function, or under ``if TYPE_CHECKING:`` (a cycle that only the type checker sees is still two
modules that cannot be understood, tested or replaced one without the other). A module that
needs something of a module above it declares a ``Protocol`` for it instead
(docs/architecture.md, "Import layers").

Edges: ``import a.b`` is an edge to ``a.b``; ``from a import b`` is an edge to the submodule
``a.b`` when there is one, else to the package ``a`` (its ``__init__``). The implicit import
of parent packages is not an edge (every module would then sit in a cycle with its
package's ``__init__``).
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator
from pathlib import Path

PACKAGE = "vibemq_server"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE

# The import layers (docs/architecture.md): what each part of the package may import of the
# package (the stdlib and third-party libraries are not constrained here). A module belongs to
# the longest key that is its name or a prefix of it; ``ADAPTER`` stands for the adapter's own
# package (``vibemq_server.adapters.mqtt`` for an MQTT module).
ADAPTER = "<the adapter itself>"
LAYERS: dict[str, frozenset[str]] = {
    # the native protocol's codec, and the payload mapping every protocol shares
    "vibemq_server.protocol": frozenset({"vibemq_server.protocol"}),
    # protocol-free, IO-free: knows no protocol, no server, no journal (a Protocol instead)
    "vibemq_server.core": frozenset({"vibemq_server.core", "vibemq_server.config"}),
    # who may connect: users file, password hashes, the authenticator (no protocol)
    "vibemq_server.auth": frozenset(
        {"vibemq_server.auth", "vibemq_server.core", "vibemq_server.config"}
    ),
    "vibemq_server.journal": frozenset(
        {"vibemq_server.journal", "vibemq_server.core", "vibemq_server.config"}
    ),
    # the broker, the shared transport, the native protocol's session: no adapter
    "vibemq_server.server": frozenset(
        {
            "vibemq_server",
            "vibemq_server.server",
            "vibemq_server.core",
            "vibemq_server.journal",
            "vibemq_server.protocol",
            "vibemq_server.config",
            "vibemq_server.auth",
        }
    ),
    # the Prometheus exposition: reads the broker, its core, journal and auth; no adapter
    "vibemq_server.metrics": frozenset(
        {
            "vibemq_server.metrics",
            "vibemq_server.server",
            "vibemq_server.core",
            "vibemq_server.journal",
            "vibemq_server.config",
            "vibemq_server.auth",
        }
    ),
    # an adapter: the core, the shared transport and adapter interface; no other adapter
    "vibemq_server.adapters": frozenset(
        {
            ADAPTER,
            "vibemq_server.core",
            "vibemq_server.server",
            "vibemq_server.protocol",
            "vibemq_server.config",
            "vibemq_server.auth",
        }
    ),
    # the management API's functions (no HTTP): over the broker, its core and users; the
    # adapters only through Protocols of their own
    "vibemq_server.management": frozenset(
        {
            "vibemq_server",
            "vibemq_server.management",
            "vibemq_server.server",
            "vibemq_server.core",
            "vibemq_server.auth",
            "vibemq_server.config",
        }
    ),
    # the management HTTP listener: a service the broker hosts (server/service.py), beside
    # the adapters; nothing below imports it, the composition root names it by import string
    "vibemq_server.http": frozenset(
        {
            "vibemq_server",
            "vibemq_server.http",
            "vibemq_server.server",
            "vibemq_server.core",
            "vibemq_server.auth",
            "vibemq_server.protocol",
            "vibemq_server.config",
            # protocol-free management functions (connections, definitions) and the
            # Prometheus collector, which the listener's routers mount
            "vibemq_server.management",
            "vibemq_server.metrics",
        }
    ),
    # the composition root knows the adapters and services only by their import strings
    "vibemq_server.app": frozenset(
        {"vibemq_server.server", "vibemq_server.core", "vibemq_server.config"}
    ),
}

# An import string such as "adapters.mqtt.server:MqttServer" (for importlib).
_ADAPTERS_IMPORT_STRING = re.compile(r"adapters(\.\w+)+(:\w+)?")


def _module_files() -> dict[str, Path]:
    """Module name -> file, following the ``adapters`` symlink."""
    modules: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(ROOT, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
        rel = Path(dirpath).relative_to(ROOT)
        parts = [PACKAGE, *rel.parts]
        for filename in sorted(filenames):
            if not filename.endswith(".py"):
                continue
            stem = filename[:-3]
            name = ".".join(parts if stem == "__init__" else [*parts, stem])
            modules[name] = Path(dirpath) / filename
    return modules


MODULES = _module_files()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _imports(name: str, tree: ast.AST) -> Iterator[tuple[str, int]]:
    """(imported module name, line) for every import in ``tree``, resolved."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = name.split(".")
                if not _is_package(name):
                    base_parts = base_parts[:-1]
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield (sub if sub in MODULES else base), node.lineno


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        graph[name] = {t for t, _ in _imports(name, tree) if t in MODULES and t != name}
    return graph


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (no recursion limit to worry about)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                out.append(sorted(component))
    return out


def _a_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One concrete cycle through the component's first module (for the failure message)."""
    members = set(component)
    start = component[0]
    # Breadth-first from start's successors back to start, inside the component.
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    return component


def _cycles() -> list[tuple[list[str], list[str]]]:
    """(the modules of a cycle-bearing component, one concrete cycle through them)."""
    graph = _graph()
    return [(c, _a_cycle(graph, c)) for c in _strongly_connected(graph) if len(c) > 1]


def test_the_package_is_found_with_its_adapters() -> None:
    assert "vibemq_server.core.manager" in MODULES
    assert "vibemq_server.adapters.mqtt.server" in MODULES  # through the symlink
    assert "vibemq_server.adapters.amqp.server" in MODULES


def test_no_import_cycles() -> None:
    unexpected = [
        f"{' -> '.join(cycle)}  (all of: {', '.join(component)})" for component, cycle in _cycles()
    ]
    assert not unexpected, "import cycles:\n" + "\n".join(unexpected)


def test_cycle_finder_finds_cycles() -> None:
    """The detector itself: a TYPE_CHECKING import inside a function closes a cycle."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    components = [c for c in _strongly_connected(graph) if len(c) > 1]
    assert components == [["a", "b", "c"]]
    assert _a_cycle(graph, components[0]) == ["a", "b", "c", "a"]
    source = (
        "from typing import TYPE_CHECKING\n"
        "def f():\n"
        "    if TYPE_CHECKING:\n"
        "        from vibemq_server.core import manager\n"
        "    from .queue import Queue\n"
        "    from . import clock\n"
    )
    found = {t for t, _ in _imports("vibemq_server.core.table", ast.parse(source))}
    assert {
        "vibemq_server.core.manager",
        "vibemq_server.core.queue",
        "vibemq_server.core.clock",
    } <= found


def _layer(name: str) -> str | None:
    keys = [k for k in LAYERS if name == k or name.startswith(k + ".")]
    return max(keys, key=len) if keys else None


def _allowed(name: str, target: str, layer: str) -> bool:
    for allowed in LAYERS[layer]:
        if allowed == ADAPTER:
            allowed = ".".join(name.split(".")[:3])  # vibemq_server.adapters.<protocol>
        if target == allowed or (allowed != PACKAGE and target.startswith(allowed + ".")):
            return True
    return False


def test_import_layers() -> None:
    graph = _graph()
    violations = []
    for name, targets in sorted(graph.items()):
        layer = _layer(name)
        if layer is None:
            continue
        violations += [
            f"{name} imports {target}"
            for target in sorted(targets)
            if not _allowed(name, target, layer)
        ]
    assert not violations, "imports across the layers:\n" + "\n".join(violations)


def test_no_top_level_adapters_import() -> None:
    """The adapters are ``vibemq_server.adapters``: importing them as ``adapters`` would load
    a second copy of every module (and depend on a top-level name any project may take)."""
    offenders = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                bad = [a.name for a in node.names if a.name.split(".")[0] == "adapters"]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                module = node.module or ""
                bad = [module] if module.split(".")[0] == "adapters" else []
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                bad = [node.value] if _ADAPTERS_IMPORT_STRING.fullmatch(node.value) else []
            else:
                continue
            offenders += [f"{name}:{getattr(node, 'lineno', '?')}: {b}" for b in bad]
    assert not offenders, "imports of the top-level name 'adapters':\n" + "\n".join(offenders)
