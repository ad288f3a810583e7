#!/usr/bin/env bash
# Set up everything and run the whole test suite. Setup: the system packages the tests use
# (podman, runc, debootstrap, mosquitto-clients, amqp-tools, libczmq-dev, systemd, prometheus
# for promtool, chromium for the dashboard's browser tests, npm for the mqtt.js browser test,
# Java 17, gcc and Python's headers for the compiled build; through apt, only those missing:
# scripts/_system.sh), then .venv with the package, the test tools and the Spark extra (only
# when pyproject.toml changed: scripts/_venv.sh). Then: lint, format check, strict typing, then
# pytest in three steps: everything but the Spark tests (unit, integration, container), the
# unit tests and the hot paths' integration tests against the compiled build
# (scripts/compile.py), then the Spark
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
# Without arguments, the compiled run takes the unit tests (the codec round trips and
# byte-at-a-time Hypothesis suites, the session fuzzers, the core) and the integration tests of
# the paths through the compiled modules: every protocol's delivery, durability and liveness.
# (The HTTP, dashboard, browser, systemd and tooling tests do not reach them differently.)
compiled_tests=("$@")
if [ "$#" -eq 0 ]; then
  compiled_tests=(tests/unit)
  for name in native_delivery native_commands native_bad_input durability disk_full liveness \
      client_library client_batching amqp_basic amqp_routing amqp_deadletter mqtt_protocol \
      mqtt_sessions mqtt_cross_protocol mqtt5 mqtt5_cross mqtt_websocket permissions tls \
      zmq_bridge auth_offloop; do
    compiled_tests+=("tests/integration/test_$name.py")
  done
fi
status=0
VIBEMQ_EXPECT_COMPILED=1 .venv/bin/python -m pytest -q -m "not spark and not container" \
  "${compiled_tests[@]}" || status=$?
if [ "$status" -ne 0 ] && ! { [ "$status" -eq 5 ] && [ "$#" -gt 0 ]; }; then
  exit "$status"
fi
.venv/bin/python scripts/compile.py --clean
# The Spark source's JVM side (format("vibemq"): reads, streams, writes; the Python source is
# vibemq.python): its jar, built here before the Spark tests, not committed.
scripts/build_jar.sh
# With a selection of tests as arguments the Spark step may have none to run (pytest's exit
# 5); without arguments, no Spark test collected is a failure.
status=0
.venv/bin/python -m pytest -q -p no:xdist -m spark "$@" || status=$?
if [ "$status" -eq 5 ] && [ "$#" -gt 0 ]; then
  status=0
fi
exit "$status"
