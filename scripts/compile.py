"""Build (or remove) the compiled hot modules in place, in this checkout.

    .venv/bin/python scripts/compile.py          # mypyc: vibemq_server/**/<module>.*.so
    .venv/bin/python scripts/compile.py --clean  # back to pure Python

The test script runs the suite once pure, then builds these and runs it again against them
(scripts/test.sh). The modules are setup.py's ``COMPILED_MODULES``. setuptools is driven
directly (not ``setup.py build_ext --inplace``) so that the venv's setuptools need not read
pyproject.toml's metadata; the C sources go to build/mypyc (kept: a rebuild reuses them).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from setup import COMPILED_MODULES, GROUP  # noqa: E402


def built_files() -> list[Path]:
    """The extension files an in-place build leaves in the checkout."""
    out = [
        p for p in ROOT.glob(GROUP.replace(".", "/") + "__mypyc*") if p.suffix in (".so", ".pyd")
    ]
    for module in COMPILED_MODULES:
        src = ROOT / module
        out += [p for p in src.parent.glob(src.stem + ".*") if p.suffix in (".so", ".pyd")]
    return out


def clean() -> None:
    for path in built_files():
        path.unlink()
        print(f"removed {path.relative_to(ROOT)}")


def build() -> None:
    from mypyc.build import mypycify
    from setuptools import Distribution

    os.chdir(ROOT)  # mypycify takes the paths relative to the top
    build_dir = ROOT / "build" / "mypyc"
    ext = mypycify(
        COMPILED_MODULES,
        opt_level="3",
        group_name=GROUP,
        target_dir=str(build_dir),
    )
    dist = Distribution({"name": "vibemq-server-compiled", "ext_modules": ext})
    cmd = dist.get_command_obj("build_ext")
    cmd.inplace = True  # type: ignore[attr-defined]
    cmd.build_temp = str(build_dir / "temp")  # type: ignore[attr-defined]
    dist.run_command("build_ext")
    for path in built_files():
        print(f"built {path.relative_to(ROOT)}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--clean", action="store_true", help="remove the built modules")
    a = p.parse_args()
    clean()
    if not a.clean:
        build()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
