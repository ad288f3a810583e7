"""Which build is running: pure Python, or the hot modules compiled with mypyc.

``HOT_MODULES`` is the one list of what the optional compiled build compiles (setup.py and
scripts/compile.py read it); ``describe()`` is what ``vibemq-server --version`` and the start
log line say. A module counts as compiled when it was loaded from an extension, not a .py file.
"""

from __future__ import annotations

import importlib

#: the modules on the native 1 -> 1 path that pay for compiling (docs/performance.md)
HOT_MODULES = (
    "vibemq_server.protocol.codec",
    "vibemq_server.server.session",
    "vibemq_server.core.queue",
    "vibemq_server.core.manager",
)


def compiled_modules() -> list[str]:
    """The hot modules loaded from compiled extensions."""
    out = []
    for name in HOT_MODULES:
        path = getattr(importlib.import_module(name), "__file__", None) or ""
        if not path.endswith(".py"):
            out.append(name)
    return out


def describe() -> str:
    """``compiled: mypyc, 4/4 hot modules`` or ``pure Python``."""
    done = len(compiled_modules())
    if not done:
        return "pure Python"
    return f"compiled: mypyc, {done}/{len(HOT_MODULES)} hot modules"
