#!/usr/bin/env bash
# Build the compiled parts in place (vibemq_server/spark/_colscan.c, the Spark source's
# columnar scanner; vibemq_server/protocol/_jsoncheck.c, the native protocol's JSON check;
# vibemq_server/protocol/_bigcopy.c, large payload joins off the GIL; vibemq_server/protocol/_glue.c,
# a frame's small pieces joined in one call; vibemq_server/protocol/_ackpeek.c, the usual
# native Ack's target in one call; vibemq_server/server/_wsunmask.c,
# a read's WebSocket frames unmasked in one call; vibemq_server/journal/_recbuf.c, the journal's
# per-message records; vibemq_server/journal/_fsyncer.c, the journal's fsync threads without the GIL;
# the last three share vibemq_server/_cext/common.h) for a checkout run with
# PYTHONPATH instead of an editable install, which builds them itself (`pip install -e .`). Needs a C compiler, Python's headers and zlib's.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
"$py" - <<'PY'
from setuptools import Distribution
from setuptools.command.build_ext import build_ext

from setuptools import Extension

# the C boilerplate shared by these three (included by a relative path; a change rebuilds them)
common = ["vibemq_server/_cext/common.h"]
dist = Distribution({"ext_modules": [
    Extension(
        "vibemq_server.spark._colscan", ["vibemq_server/spark/_colscan.c"], libraries=["z"]
    ),
    Extension("vibemq_server.protocol._jsoncheck", ["vibemq_server/protocol/_jsoncheck.c"]),
    Extension(
        "vibemq_server.protocol._bigcopy", ["vibemq_server/protocol/_bigcopy.c"], depends=common
    ),
    Extension("vibemq_server.protocol._glue", ["vibemq_server/protocol/_glue.c"]),
    Extension("vibemq_server.protocol._ackpeek", ["vibemq_server/protocol/_ackpeek.c"]),
    Extension("vibemq_server.server._wsunmask", ["vibemq_server/server/_wsunmask.c"]),
    Extension("vibemq_server.journal._recbuf", ["vibemq_server/journal/_recbuf.c"], depends=common),
    Extension(
        "vibemq_server.journal._fsyncer", ["vibemq_server/journal/_fsyncer.c"], depends=common
    ),
]})
cmd = build_ext(dist)
cmd.inplace = True
cmd.ensure_finalized()
cmd.run()
PY
