"""When an incomplete frame counts as stalled (``frame_timeout_s``), shared by the sessions.

The clock restarts when a frame completes, and also while one big frame keeps arriving: a
64 MiB message over a slow link takes longer than ``frame_timeout_s`` without being stalled.
Growth of less than :data:`STALL_PROGRESS_BYTES` does not restart it, so a peer dribbling a few
bytes now and then still times out (a slowloris must send 64 KiB per ``frame_timeout_s``, and
the size limit bounds what it can make the broker hold).
"""

from __future__ import annotations

from typing import Final

#: Growth of the incomplete frame that counts as progress.
STALL_PROGRESS_BYTES: Final = 64 * 1024


class StallClock:
    """Since when the incoming frame has been incomplete without progress (None: no frame
    is incomplete)."""

    __slots__ = ("mark", "since")

    def __init__(self) -> None:
        self.since: float | None = None
        self.mark = 0  # bytes buffered when the clock last restarted

    def after_read(self, buffered: int, completed: bool, now: float) -> None:
        """After a read: ``buffered`` bytes of an incomplete frame held, ``completed``: some
        frame completed in this read."""
        if not buffered:
            self.since = None
        elif completed or self.since is None or buffered - self.mark >= STALL_PROGRESS_BYTES:
            self.since = now
            self.mark = buffered

    def stalled(self, now: float, timeout: float) -> bool:
        since = self.since
        return since is not None and now - since > timeout
