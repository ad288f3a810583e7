# Sourced by scripts/_venv.sh (so by run.sh, test.sh and env.sh): the system (Debian) packages
# the scripts need. Each check looks at what is on the machine first and runs apt-get only for
# what is missing, so a machine that has everything never touches apt (a second run is fast).
# Installing needs root (as on CI) or sudo; without either it says what to install and fails.

_system_apt_updated=

# system_apt_install PKG...: apt-get install, with one apt-get update per run before the first.
system_apt_install() {
  local sudo=()
  if ! command -v apt-get >/dev/null; then
    echo "missing: $* (Debian packages); no apt-get here: install their equivalents" >&2
    return 1
  fi
  if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null; then
      echo "missing: $*; install them as root: apt-get install $*" >&2
      return 1
    fi
    sudo=(sudo)
  fi
  echo "installing system packages: $*" >&2
  # wait for another apt (say, unattended-upgrades on a fresh machine) instead of failing
  local wait=(-o DPkg::Lock::Timeout=600)
  if [ -z "$_system_apt_updated" ]; then
    "${sudo[@]}" apt-get "${wait[@]}" update -q >/dev/null
    _system_apt_updated=1
  fi
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${wait[@]}" install -y -q "$@" >/dev/null
}

# system_need_test: what the test suite runs besides Python packages.
system_need_test() {
  local pkgs=()
  # The container test builds and runs the Docker image with podman
  # (../shared/tools/container-run.sh: runc, and debootstrap for the base image).
  command -v podman >/dev/null || pkgs+=(podman)
  command -v runc >/dev/null || pkgs+=(runc)
  command -v debootstrap >/dev/null || pkgs+=(debootstrap)
  # The MQTT interoperability tests run Debian's mosquitto_pub / mosquitto_sub.
  if ! command -v mosquitto_pub >/dev/null || ! command -v mosquitto_sub >/dev/null; then
    pkgs+=(mosquitto-clients)
  fi
  # The TLS tests run openssl s_client (verification, TLS 1.0/1.1 refused).
  command -v openssl >/dev/null || pkgs+=(openssl)
  # The AMQP interoperability tests run Debian's amqp-tools (amqp-publish, amqp-consume, ...).
  if ! command -v amqp-publish >/dev/null || ! command -v amqp-consume >/dev/null \
    || ! command -v amqp-get >/dev/null || ! command -v amqp-declare-queue >/dev/null; then
    pkgs+=(amqp-tools)
  fi
  # The systemd unit is checked with systemd-analyze verify/security (Debian's systemd).
  command -v systemd-analyze >/dev/null || pkgs+=(systemd)
  # The 50/MME codec tests check against czmq's own zmsg_encode/zmsg_decode (libczmq, ctypes).
  dpkg -s libczmq-dev >/dev/null 2>&1 || pkgs+=(libczmq-dev)
  # The Spark source's C scanner (vibemq_server/spark/_colscan.c) is built by the editable
  # install; its tests fail, never skip, without it: a C compiler and zlib's headers.
  command -v cc >/dev/null || pkgs+=(gcc)
  [ -f /usr/include/zlib.h ] || pkgs+=(zlib1g-dev)
  # The metrics tests check the Prometheus exposition with promtool (Debian's prometheus).
  command -v promtool >/dev/null || pkgs+=(prometheus)
  # The dashboard's tests drive Debian's chromium with Playwright (no browser download).
  command -v chromium >/dev/null || pkgs+=(chromium)
  # The MQTT-over-WebSockets browser test loads mqtt.js, which it installs with npm from the
  # npm registry into a cache (tests/integration/test_mqtt_websocket_browser.py).
  command -v npm >/dev/null || pkgs+=(npm)
  # The compiled build's test run (scripts/compile.py: mypyc) needs a C compiler and the
  # headers of the Python it builds for (a Debian python3's come with python3-dev).
  command -v cc >/dev/null || pkgs+=(gcc)
  if ! .venv/bin/python -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(
      os.path.join(sysconfig.get_paths()["include"], "Python.h")))' 2>/dev/null; then
    pkgs+=(python3-dev)
  fi
  # The Spark step (pyspark from PyPI) needs a Java 17 runtime, and the JVM reader of the
  # journal (scripts/build_jar.sh) the compiler: a JDK.
  if ! command -v javac >/dev/null \
      && ! { [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/javac" ]; }; then
    pkgs+=(openjdk-17-jdk-headless)
  fi
  if [ "${#pkgs[@]}" -gt 0 ]; then
    system_apt_install "${pkgs[@]}"
  fi
}
