#!/usr/bin/env bash
# Set everything up (virtualenv, package, test tools) and run the whole test suite:
# lint, format check, strict typing, then pytest (unit, integration, container).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_venv.sh
.venv/bin/pip install -q -e '.[test]'
.venv/bin/ruff check vibemq_server adapters tests bench
.venv/bin/ruff format --check vibemq_server adapters tests bench
.venv/bin/mypy
exec .venv/bin/python -m pytest -q "$@"
