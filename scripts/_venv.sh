# Sourced by run.sh, test.sh and env.sh (from the repository's top, with `set -euo pipefail`):
# make .venv with Python 3.11+ if it is not there, and install the package into it, editable.
# The install is redone only when pyproject.toml (dependencies, entry points) changed since the
# last one with the same extras: a stamp per extra set in .venv holds the hash it was done for.
# Editable means code changes need no reinstall, so a second run starts at once.
. scripts/_system.sh

venv_create() {
  if [ -x .venv/bin/python ] && [ -x .venv/bin/pip ]; then
    return 0
  fi
  local py=${PYTHON:-python3}
  if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "VibeMQ needs Python 3.11+ ($py is not; set PYTHON=/path/to/python3.11)" >&2
    return 1
  fi
  # --clear: a .venv without pip is one whose creation failed half-way
  if ! "$py" -m venv --clear .venv >/dev/null 2>&1; then
    # Debian's own python3 ships venv (ensurepip) as a package of its own
    system_apt_install python3-venv
    "$py" -m venv --clear .venv
  fi
  .venv/bin/pip install -q --upgrade pip
}

# venv_install [EXTRAS]: `pip install -e .[EXTRAS]` unless the stamp says it is done.
venv_install() {
  local extras=${1:-} spec=. name=base want
  if [ -n "$extras" ]; then
    spec=".[$extras]"
    name=$extras
  fi
  venv_create
  want=$(sha256sum pyproject.toml | cut -d' ' -f1)
  if [ -x .venv/bin/vibemq-server ] && [ "$(cat ".venv/.installed-$name" 2>/dev/null)" = "$want" ]; then
    return 0
  fi
  echo "installing vibemq-server${extras:+[$extras]} into .venv (pip)" >&2
  .venv/bin/pip install -q -e "$spec"
  echo "$want" >".venv/.installed-$name"
  # an install with extras includes the plain one
  echo "$want" >.venv/.installed-base
}
