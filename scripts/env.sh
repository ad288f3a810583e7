# Source this from a shell (bash, zsh or sh), in the repository's top folder or by its path:
#   . scripts/env.sh
# It sets up .venv as scripts/run.sh does (at once when nothing changed) and puts .venv/bin first
# on this shell's PATH, so vibemq-server, vibemq, vibemq-analytics and vibemq-replay are commands.
# (`. .venv/bin/activate` does the same once .venv is there.)
_vibemq_root=$(cd "$(dirname "${BASH_SOURCE:-$0}")/.." 2>/dev/null && pwd)
if [ ! -f "$_vibemq_root/scripts/env.sh" ]; then
  # a shell that does not tell a sourced file its path (dash): the current folder
  _vibemq_root=$PWD
fi
if [ ! -f "$_vibemq_root/scripts/_venv.sh" ]; then
  echo "scripts/env.sh: source it from the VibeMQ repository's top folder" >&2
  unset _vibemq_root
  return 1
fi
if ! bash -c 'set -euo pipefail; cd "$1"; . scripts/_venv.sh; venv_install' env.sh "$_vibemq_root"; then
  unset _vibemq_root
  return 1
fi
case ":$PATH:" in
  *":$_vibemq_root/.venv/bin:"*) ;;
  *) PATH="$_vibemq_root/.venv/bin:$PATH" && export PATH ;;
esac
unset _vibemq_root
