#!/usr/bin/env bash
# Set up everything and run the whole test suite. Setup: the system packages the tests use
# (podman, runc, debootstrap, mosquitto-clients, amqp-tools, libczmq-dev, systemd, prometheus
# for promtool, chromium for the dashboard's browser tests, npm for the mqtt.js browser test,
# Java 17, gcc and Python's headers for the compiled build; through apt, only those missing:
# scripts/_system.sh), then .venv with the package, the test tools and the Spark extra (only
# when pyproject.toml changed: scripts/_venv.sh). Then: lint, format check, strict typing, then
# pytest in three steps: everything but the Spark tests (unit, integration, container), the
# same but the container tests against the compiled build (scripts/compile.py), then the Spark
# tests (marker "spark") on their own, serially, in one local SparkSession. The Spark step
# needs Java 17 (`java` on PATH or JAVA_HOME) and fails, never skips, without it. Arguments go
# to every pytest run.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_venv.sh
system_need_test
venv_install test,spark
.venv/bin/ruff check vibemq_server adapters tests bench
.venv/bin/ruff format --check vibemq_server adapters tests bench
.venv/bin/mypy
# Pure Python first (an in-place build left in the checkout would shadow the sources).
.venv/bin/python scripts/compile.py --clean >/dev/null
.venv/bin/python -m pytest -q -m "not spark" "$@"
# The compiled build (setup.py, docs/performance.md): the hot modules compiled in place with
# mypyc, the suite again against them (not the container tests: the image compiles its own),
# then back to pure Python, whatever happens. A selection of tests as arguments may have none
# to run here (pytest's exit 5).
trap '.venv/bin/python scripts/compile.py --clean >/dev/null' EXIT
.venv/bin/python scripts/compile.py
.venv/bin/vibemq-server --version
status=0
VIBEMQ_EXPECT_COMPILED=1 .venv/bin/python -m pytest -q -m "not spark and not container" "$@" \
  || status=$?
if [ "$status" -ne 0 ] && ! { [ "$status" -eq 5 ] && [ "$#" -gt 0 ]; }; then
  exit "$status"
fi
.venv/bin/python scripts/compile.py --clean
# With a selection of tests as arguments the Spark step may have none to run (pytest's exit
# 5); without arguments, no Spark test collected is a failure.
status=0
.venv/bin/python -m pytest -q -p no:xdist -m spark "$@" || status=$?
if [ "$status" -eq 5 ] && [ "$#" -gt 0 ]; then
  status=0
fi
exit "$status"
