# Sourced by run.sh and test.sh: make .venv with Python 3.11+ if it is not there yet.
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  if ! "$PY" -m venv .venv 2>/dev/null; then
    # Debian's own python3 ships venv separately
    apt-get install -y -q python3-venv >/dev/null
    "$PY" -m venv .venv
  fi
  .venv/bin/pip install -q --upgrade pip
fi
