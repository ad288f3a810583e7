"""The build says what it is: ``vibemq-server --version`` names pure Python or the compiled
build (mypyc), and that matches where the hot modules were loaded from."""

from __future__ import annotations

import importlib
import subprocess
import sys

from vibemq_server import __version__
from vibemq_server.buildinfo import HOT_MODULES, compiled_modules, describe


def test_describe_matches_the_loaded_modules() -> None:
    compiled = [
        name
        for name in HOT_MODULES
        if not (importlib.import_module(name).__file__ or "").endswith(".py")
    ]
    assert compiled_modules() == compiled
    if compiled:
        assert describe() == f"compiled: mypyc, {len(compiled)}/{len(HOT_MODULES)} hot modules"
    else:
        assert describe() == "pure Python"


def test_version_names_the_build() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "vibemq_server", "--version"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert out.strip() == f"vibemq-server {__version__} ({describe()})"
