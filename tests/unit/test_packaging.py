"""The wheel installs one top-level package, ``vibemq_server``, with the adapters inside it.

``adapters/`` sits at the top of the repository (the layout), but a top-level package named
``adapters`` in site-packages would clash with any other project's; the symlink
``vibemq_server/adapters -> ../adapters`` installs it as ``vibemq_server.adapters``.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_wheel_holds_only_the_vibemq_server_package(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(REPO)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (wheel,) = tmp_path.glob("vibemq_server-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"vibemq_server"}
    adapters = {n for n in names if n.startswith("vibemq_server/adapters/")}
    for module in ("mqtt/codec.py", "amqp/codec.py", "zmq/bridge.py"):
        assert f"vibemq_server/adapters/{module}" in adapters
    # the API docs page works offline: Swagger UI ships in the wheel, with its licence
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css", "LICENSE", "NOTICE"):
        assert f"vibemq_server/http/static/swagger-ui/{asset}" in names
