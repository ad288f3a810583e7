"""czmq's own 50/MME encoder and decoder through ctypes, the reference the codec is checked
against (Debian's ``libczmq4``/``libczmq-dev``; ``scripts/test.sh`` installs it).

A missing libczmq raises :class:`RuntimeError`: the cross-checks must fail, never skip.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Sequence


def _load() -> ctypes.CDLL:
    name = ctypes.util.find_library("czmq")
    candidates = [n for n in (name, "libczmq.so.4", "libczmq.so") if n]
    for candidate in candidates:
        try:
            return ctypes.CDLL(candidate)
        except OSError:
            continue
    raise RuntimeError(
        "libczmq not found: apt-get install libczmq-dev (scripts/test.sh installs it)"
    )


class Czmq:
    """``encode(frames) -> bytes`` and ``decode(data) -> frames | None`` by czmq 4.x
    (``zmsg_encode`` returns a new ``zframe_t *``; ``zmsg_decode`` returns NULL when the
    input is badly formatted)."""

    def __init__(self) -> None:
        lib = self.lib = _load()
        vp = ctypes.c_void_p
        lib.zmsg_new.restype = vp
        lib.zmsg_new.argtypes = []
        lib.zmsg_destroy.restype = None
        lib.zmsg_destroy.argtypes = [ctypes.POINTER(vp)]
        lib.zmsg_addmem.restype = ctypes.c_int
        lib.zmsg_addmem.argtypes = [vp, ctypes.c_char_p, ctypes.c_size_t]
        lib.zmsg_append.restype = ctypes.c_int
        lib.zmsg_append.argtypes = [vp, ctypes.POINTER(vp)]
        lib.zmsg_pop.restype = vp
        lib.zmsg_pop.argtypes = [vp]
        lib.zmsg_size.restype = ctypes.c_size_t
        lib.zmsg_size.argtypes = [vp]
        lib.zmsg_encode.restype = vp
        lib.zmsg_encode.argtypes = [vp]
        lib.zmsg_decode.restype = vp
        lib.zmsg_decode.argtypes = [vp]
        lib.zframe_new.restype = vp
        lib.zframe_new.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        lib.zframe_destroy.restype = None
        lib.zframe_destroy.argtypes = [ctypes.POINTER(vp)]
        lib.zframe_size.restype = ctypes.c_size_t
        lib.zframe_size.argtypes = [vp]
        lib.zframe_data.restype = ctypes.POINTER(ctypes.c_ubyte)
        lib.zframe_data.argtypes = [vp]

    def _frame_bytes(self, frame: int) -> bytes:
        size = self.lib.zframe_size(frame)
        return ctypes.string_at(self.lib.zframe_data(frame), size) if size else b""

    def encode(self, frames: Sequence[bytes]) -> bytes:
        lib = self.lib
        msg = ctypes.c_void_p(lib.zmsg_new())
        try:
            for part in frames:
                frame = ctypes.c_void_p(lib.zframe_new(part, len(part)))
                assert lib.zmsg_append(msg, ctypes.byref(frame)) == 0
            encoded = ctypes.c_void_p(lib.zmsg_encode(msg))
            assert encoded.value, "zmsg_encode returned NULL"
            try:
                return self._frame_bytes(encoded.value)
            finally:
                lib.zframe_destroy(ctypes.byref(encoded))
        finally:
            lib.zmsg_destroy(ctypes.byref(msg))

    def decode(self, data: bytes) -> list[bytes] | None:
        lib = self.lib
        frame = ctypes.c_void_p(lib.zframe_new(data, len(data)))
        try:
            msg = ctypes.c_void_p(lib.zmsg_decode(frame))
        finally:
            lib.zframe_destroy(ctypes.byref(frame))
        if not msg.value:
            return None
        try:
            out: list[bytes] = []
            while True:
                part = ctypes.c_void_p(lib.zmsg_pop(msg))
                if not part.value:
                    return out
                out.append(self._frame_bytes(part.value))
                lib.zframe_destroy(ctypes.byref(part))
        finally:
            lib.zmsg_destroy(ctypes.byref(msg))
