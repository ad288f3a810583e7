"""systemd's readiness protocol (``Type=notify``), spoken without a library.

The service manager names a unix datagram socket in ``$NOTIFY_SOCKET`` (a path, or an abstract
address when it starts with ``@``); each state change is one datagram of ``KEY=VALUE`` lines
(sd_notify(3)): ``READY=1`` once the broker answers, ``RELOADING=1`` (with ``MONOTONIC_USEC``,
which systemd 253+ wants) and ``READY=1`` again around a SIGHUP reload, ``STOPPING=1`` when it
starts draining. Without ``$NOTIFY_SOCKET`` (not run by systemd) every call does nothing; a
failed send is logged and never stops the broker.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping

import structlog

log = structlog.get_logger("vibemq.sdnotify")


def _address(value: str) -> str | None:
    """The socket address ``$NOTIFY_SOCKET`` names; None for what we do not speak (vsock)."""
    if value.startswith("@"):
        return "\0" + value[1:]  # Linux's abstract namespace
    if value.startswith("/"):
        return value
    return None


class Notifier:
    """Sends the broker's state changes to systemd, when systemd asked for them."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        value = env.get("NOTIFY_SOCKET", "")
        self.address = _address(value) if value else None
        if value and self.address is None:
            log.warning("NOTIFY_SOCKET not understood; no readiness notifications", value=value)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, **fields: str) -> bool:
        """One datagram of ``KEY=VALUE`` lines (keyword names upper-cased); True when sent."""
        if self.address is None:
            return False
        data = "\n".join(f"{key.upper()}={value}" for key, value in fields.items()).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.connect(self.address)
                sock.sendall(data)
        except OSError as exc:
            log.warning("systemd notification failed", error=str(exc))
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.send(ready="1", status=status)

    def reloading(self) -> bool:
        # systemd (253+) orders the reload by this timestamp (CLOCK_MONOTONIC, microseconds).
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.send(reloading="1", status="reloading", monotonic_usec=str(usec))

    def stopping(self, status: str = "draining connections") -> bool:
        return self.send(stopping="1", status=status)
