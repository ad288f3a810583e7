#!/usr/bin/env bash
# Set everything up and run the broker in the foreground on the default config
# (VibeMQ on 127.0.0.1:2925, data in ./data). Extra arguments go to vibemq-server.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_venv.sh
.venv/bin/pip install -q -e .
exec .venv/bin/vibemq-server --config config/vibemq.toml --data-dir ./data "$@"
