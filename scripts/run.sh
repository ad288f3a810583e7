#!/usr/bin/env bash
# Set up .venv (only what changed: at once when nothing did) and run the broker in the
# foreground on the default config (VibeMQ on 127.0.0.1:2925, data in ./data). Extra arguments
# go to vibemq-server.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_venv.sh
venv_install
echo "vibemq-server and vibemq are in .venv/bin; to use them in a shell: . scripts/env.sh" >&2
exec .venv/bin/vibemq-server --config config/vibemq.toml --data-dir ./data "$@"
