"""Types of the compiled record encoder (``_recbuf.c``; the pure one is batch.PyRecordBuffer)."""

import mmap

class RecordBuffer:
    def publish(
        self,
        name16: bytes,
        seq: int,
        message_id: str,
        published_at: int,
        expires_at: int,
        priority: int,
        attempts: int,
        payload: bytes,
        /,
    ) -> int: ...
    def stamp(self, timestamp: int, /) -> None: ...
    def deliver(self, name16: bytes, seq: int, attempts: int, /) -> None: ...
    def settle(self, name16: bytes, seq: int, reason: int, detail: str, /) -> None: ...
    def settle_all(self, name16: bytes, seqs: list[int], reason: int, /) -> None: ...
    def take(self) -> bytes: ...
    def __len__(self) -> int: ...

def index_scan(
    data: bytes | mmap.mmap, pos: int, queue_at: bytes, /
) -> tuple[bool, int, int, int, int, list[tuple[bytes, int, int, int, bytes]]]: ...
