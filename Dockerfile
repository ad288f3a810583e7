# VibeMQ broker image.
#
#   docker build -t vibemq .
#   docker run -d -p 2925:2925 -p 1883:1883 -p 5672:5672 -v vibemq-data:/data \
#       -e VIBEMQ_AUTH_TOKENS=s3cret vibemq
#
# The broker listens on 0.0.0.0 here, so it needs credentials to start (secure by default, as
# Mosquitto 2.0): a token (-e VIBEMQ_AUTH_TOKENS=TOKEN[:USER]), a users file (in the /data
# volume, or mounted and named by VIBEMQ_USERS_FILE), or an explicit
# -e VIBEMQ_ALLOW_ANONYMOUS=true. Without any of them it exits 2 and says how to fix it.
# TLS: mount certificates read-only and set VIBEMQ_TLS__CERT_FILE / VIBEMQ_TLS__KEY_FILE.
#
# Two stages: the builder turns the checkout into wheels (the project's and its dependencies');
# the final stage installs those wheels only -- no source tree, no build tools, no pip cache.
# See docs/docker.md.

ARG PYTHON_IMAGE=python:3.11-slim

# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

# The compiled build (setup.py, docs/performance.md): mypyc turns the hot modules into C
# extensions, and the Spark source has a C scanner (zlib), so the builder needs a C compiler,
# zlib's headers and Python's (python:3.11-slim has them; a Debian-Python base gets
# python3-dev); the final stage gets the compiled wheel only. --build-arg VIBEMQ_COMPILE=0
# builds the pure wheel (the Spark scanner is still built where a compiler is found).
ARG VIBEMQ_COMPILE=1
RUN if [ "$VIBEMQ_COMPILE" = 1 ]; then \
        pkgs="gcc libc6-dev zlib1g-dev"; \
        python3 -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
            || pkgs="$pkgs python3-dev"; \
        apt-get update \
     && apt-get install -y --no-install-recommends $pkgs \
     && rm -rf /var/lib/apt/lists/*; \
    fi

WORKDIR /src
# .dockerignore keeps .git, .venv, data, caches and in-place built modules out of the context.
COPY . .
# All wheels land in /wheels, so the final stage installs without a network or a compiler.
RUN VIBEMQ_COMPILE="$VIBEMQ_COMPILE" pip wheel --no-cache-dir --wheel-dir /wheels .

# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}

ARG VIBEMQ_UID=10001
ARG VIBEMQ_GID=10001

LABEL org.opencontainers.image.title="VibeMQ" \
      org.opencontainers.image.description="Message broker: native VibeMQ protocol, MQTT 3.1/3.1.1, AMQP 0-9-1 and a ZeroMQ bridge, optionally over TLS" \
      org.opencontainers.image.licenses="MIT"

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    VIBEMQ_HOST=0.0.0.0 \
    VIBEMQ_PORT=2925 \
    VIBEMQ_DATA_DIR=/data \
    VIBEMQ_LOG_FORMAT=json \
    VIBEMQ_DRAIN_TIMEOUT_S=8

# An unprivileged system user owns the data directory; the broker never runs as root.
RUN groupadd --system --gid "${VIBEMQ_GID}" vibemq \
 && useradd --system --uid "${VIBEMQ_UID}" --gid vibemq --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin vibemq \
 && mkdir -p /data \
 && chown "${VIBEMQ_UID}:${VIBEMQ_GID}" /data \
 && chmod 0750 /data

# Install the builder's wheels, offline. (COPY rather than `RUN --mount=from=builder`: buildah,
# which podman builds with, does not key its layer cache on a mounted stage's content, so a
# changed wheel could be skipped for a stale cached layer.)
COPY --from=builder /wheels /tmp/wheels
# (--version says "compiled: mypyc, 23/23 hot modules" or "pure Python")
RUN pip install --no-cache-dir --no-index --find-links /tmp/wheels vibemq-server \
 && rm -rf /tmp/wheels \
 && vibemq-server --version

# Declared after the chown above: a fresh named volume starts out owned by the vibemq user.
VOLUME ["/data"]
WORKDIR /data

# Plain: 2925 VibeMQ native protocol, 1883 MQTT, 5672 AMQP 0-9-1. TLS: 2926 VibeMQ, 8883 MQTT,
# 5671 AMQP; those listen only once a certificate is configured (VIBEMQ_TLS__CERT_FILE), and
# each plain one can then be turned off (VIBEMQ_TLS__PLAIN_VIBEMQ=false, ...). ZeroMQ has no
# default endpoint (VIBEMQ_ZMQ__PULL / VIBEMQ_ZMQ__PUB), so it has no EXPOSE. 2927: the
# management HTTP listener (health open; the API needs a user or token from outside the
# container, docs/management.md), 2928 its HTTPS once a certificate is configured.
EXPOSE 2925 1883 5672 2926 8883 5671 2927 2928

USER ${VIBEMQ_UID}:${VIBEMQ_GID}

# A real protocol round trip (Connect/ConnectAck + Ping/Pong) with the stdlib only; it sends
# VIBEMQ_HEALTHCHECK_TOKEN, or else the first of VIBEMQ_AUTH_TOKENS, as the authToken (or
# VIBEMQ_HEALTHCHECK_USERNAME / _PASSWORD, for a users file only). With the plain VibeMQ
# listener off (VIBEMQ_TLS__PLAIN_VIBEMQ=false) it probes the TLS port, VIBEMQ_TLS__PORT.
HEALTHCHECK --interval=15s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-m", "vibemq_server.healthcheck"]

# The broker drains and exits 0 on SIGTERM (docker stop / podman stop).
STOPSIGNAL SIGTERM
ENTRYPOINT ["vibemq-server"]
CMD []
