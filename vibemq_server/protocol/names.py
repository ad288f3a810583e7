"""Validation of queue names: 1..256 letters, digits, '-', '_' and '.', as the original allows."""

from __future__ import annotations

import re

_QUEUE_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,256}")


def valid_queue_name(name: str) -> bool:
    return _QUEUE_NAME.fullmatch(name) is not None
