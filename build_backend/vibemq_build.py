"""The build backend: setuptools', plus mypy as a build requirement when compiling.

``VIBEMQ_COMPILE=1`` asks for the compiled build (setup.py); only then does the isolated build
environment need mypy (mypyc ships with it), and the package's own dependencies: mypyc
type-checks the modules as ``mypy`` does (strict, the pydantic plugin), which needs the
packages they import. Everything else is setuptools.build_meta.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from setuptools import build_meta as _orig
from setuptools.build_meta import *  # noqa: F403  (the backend's whole interface)

#: mypyc comes with mypy (the same range as the test tools' mypy); then what the code imports
_COMPILER = [
    "mypy>=1.10",
    *tomllib.loads(Path("pyproject.toml").read_text())["project"]["dependencies"],
]
_FLAG = "VIBEMQ_COMPILE"


@contextmanager
def _listing_only() -> Iterator[list[str]]:
    """setuptools runs setup.py to list the requirements, before mypy is installed: run it
    as a pure build then, and add mypy to what it says when a compiled build was asked for."""
    wanted = os.environ.get(_FLAG, "")
    extra = _COMPILER if wanted == "1" else []
    os.environ[_FLAG] = "0"
    try:
        yield extra
    finally:
        os.environ[_FLAG] = wanted


def get_requires_for_build_wheel(config_settings=None):  # type: ignore[no-untyped-def]
    with _listing_only() as extra:
        return _orig.get_requires_for_build_wheel(config_settings) + extra


def get_requires_for_build_editable(config_settings=None):  # type: ignore[no-untyped-def]
    with _listing_only() as extra:
        return _orig.get_requires_for_build_editable(config_settings) + extra
