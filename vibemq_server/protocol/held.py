"""Input held over between reads, shared by the incremental decoders of every protocol.

A frame that arrives in many reads (a 1 MB publish comes in 4 to 16 reads of up to 256 KB)
is kept as the reads' own objects and joined once, when the frame's announced length is in:
one copy per frame, whatever the number of reads. Appending every read to a ``bytearray``
and copying that out again per read (``bytes(buffer)``) was quadratic in the number of
reads: a 64 MB frame copied some 8 GB.

The decoder says how many bytes it needs before parsing can make progress (the whole frame
once its header is read; one more byte while the header itself is cut), and gets the joined
bytes back only then.
"""

from __future__ import annotations

Buffer = bytes | bytearray | memoryview


class HeldInput:
    """The tail of earlier reads that does not yet make a frame, as a list of chunks."""

    __slots__ = ("_need", "_parts", "size")

    def __init__(self) -> None:
        self._parts: list[Buffer] = []
        #: bytes held
        self.size = 0
        self._need = 0

    def hold(self, data: bytes, start: int, need: int) -> None:
        """Keep ``data[start:]`` (a view: no copy) until ``need`` bytes are held in all.

        ``data`` must be immutable (bytes): the view outlives the call."""
        tail = memoryview(data)[start:] if start else data
        self._parts = [tail]
        self.size = len(tail)
        self._need = need

    def add(self, data: Buffer) -> bytes | None:
        """Append a read; the held bytes joined (one copy) once ``need`` of them are in, and
        then nothing is held any more; None while more are needed."""
        if type(data) is not bytes:
            data = bytes(data)  # a caller's mutable buffer may change after the call
        self._parts.append(data)
        self.size += len(data)
        if self.size < self._need:
            return None
        joined = b"".join(self._parts)
        self.clear()
        return joined

    def clear(self) -> None:
        self._parts = []
        self.size = 0
        self._need = 0
