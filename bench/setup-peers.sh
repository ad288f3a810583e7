#!/bin/sh
# Install the peer brokers used by bench/compare.py (Debian/Ubuntu, run as root).
# The packages' own services are not needed: compare.py starts private instances on free
# loopback ports in temporary directories and stops them afterwards.
set -eu
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q mosquitto mosquitto-clients rabbitmq-server
# The package may start system-wide services; they are not used by the benchmark.
if command -v service >/dev/null 2>&1; then
    service mosquitto stop >/dev/null 2>&1 || true
    service rabbitmq-server stop >/dev/null 2>&1 || true
fi
mosquitto -h 2>/dev/null | head -1 || true
dpkg -s rabbitmq-server | grep '^Version' || true
