"""The optional compiled build: the hot modules through mypyc, only when asked for.

``VIBEMQ_COMPILE=1 pip wheel .`` (what the Dockerfile does; it needs a C compiler and the
Python headers) compiles the hot modules (``HOT_MODULES`` in vibemq_server/buildinfo.py) to C
extensions with mypyc; without it the package is pure Python, everywhere. The in-tree build
backend (build_backend/vibemq_build.py) adds mypy to the build requirements only then, so a
pure install never downloads it. The modules are mypy-strict already, which is why mypyc (it
compiles type-annotated Python as it is) rather than Cython. The in-place build for the tests
is scripts/compile.py, which takes the list from here; docs/performance.md says what pays.
"""

from __future__ import annotations

import os
import runpy
from pathlib import Path

_TOP = Path(__file__).resolve().parent
#: vibemq_server/buildinfo.py holds the list (it says at run time which ones are compiled)
HOT_MODULES: tuple[str, ...] = runpy.run_path(str(_TOP / "vibemq_server/buildinfo.py"))[
    "HOT_MODULES"
]
#: the modules mypyc compiles, as paths from the top of the checkout
COMPILED_MODULES = [name.replace(".", "/") + ".py" for name in HOT_MODULES]
#: the one shared library holding them: ``vibemq_server/_hot__mypyc``, inside the package so
#: that an editable install (which maps only the package) finds it
GROUP = "vibemq_server._hot"


def compiling() -> bool:
    return os.environ.get("VIBEMQ_COMPILE", "") == "1"


def ext_modules() -> list[object]:
    """mypyc's extensions for ``COMPILED_MODULES`` (opt-level 3, no debug asserts)."""
    from mypyc.build import mypycify  # (only a compiled build needs mypy)

    return list(mypycify(COMPILED_MODULES, opt_level="3", group_name=GROUP))


if __name__ == "__main__":
    from setuptools import setup

    setup(ext_modules=ext_modules() if compiling() else [])
