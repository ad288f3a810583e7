"""Output buffers gathered for one write: small ones joined, large ones passed through.

What the transport writes to a socket and the journal to its segment are many small pieces
(acks, records) and now and then a large one (a message's payload): joining everything would
copy a large payload once more just to glue it to its few bytes of header. ``coalesce`` joins
each run of small pieces and leaves the large ones as they are, for one ``writelines`` /
``os.writev``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

Buffer = bytes | memoryview

#: Gathered output of at most this much is simply joined (cheaper than a vectored write of
#: many small pieces).
JOIN_ALL: Final = 64 * 1024
#: A piece at least this large is written as it is, never copied into a join.
PASS_THROUGH: Final = 16 * 1024


def coalesce(out: Sequence[Buffer]) -> list[Buffer]:
    """``out`` with each run of small pieces joined and the large ones passed through."""
    pieces: list[Buffer] = []
    run: list[Buffer] = []
    for piece in out:
        if len(piece) >= PASS_THROUGH:
            if run:
                pieces.append(b"".join(run) if len(run) > 1 else run[0])
                run = []
            pieces.append(piece)
        else:
            run.append(piece)
    if run:
        pieces.append(b"".join(run) if len(run) > 1 else run[0])
    return pieces
