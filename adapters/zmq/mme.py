"""The RFC 50/MME codec, re-exported: see :mod:`vibemq_server.protocol.mme` (kept there so
the client library needs neither this package nor pyzmq)."""

from vibemq_server.protocol.mme import (
    CONTENT_TYPE,
    MAX_FRAME_SIZE,
    MME_CONTENT_TYPE,
    MmeError,
    MmeErrorCode,
    decode,
    encode,
    encoded_size,
)

__all__ = [
    "CONTENT_TYPE",
    "MAX_FRAME_SIZE",
    "MME_CONTENT_TYPE",
    "MmeError",
    "MmeErrorCode",
    "decode",
    "encode",
    "encoded_size",
]
