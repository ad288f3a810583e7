"""Password hashes: scrypt from the standard library (``hashlib.scrypt``, OpenSSL's).

scrypt is memory-hard (each guess needs ``128 * n * r`` bytes: 16 MiB here), so guessing on
GPUs costs far more than with an iterated hash, and it needs no new dependency. The
parameters and a per-password random salt are stored with the hash, so they can be raised
later without invalidating existing entries. Format (modular crypt style)::

    $scrypt$ln=14,r=8,p=1$<salt, base64>$<key, base64>
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import os

#: log2 of scrypt's cost n; 14 (16 MiB, some 50 ms) keeps a login's verification from
#: stalling the event loop for long, successful ones are cached (authenticator.py).
DEFAULT_LOG_N = 14
DEFAULT_R = 8
DEFAULT_P = 1
_KEY_LEN = 32
_SALT_LEN = 16


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


def _scrypt(password: str, salt: bytes, log_n: int, r: int, p: int) -> bytes:
    n = 1 << log_n
    return hashlib.scrypt(
        password.encode(), salt=salt, n=n, r=r, p=p, maxmem=256 * n * r * p, dklen=_KEY_LEN
    )


def hash_password(password: str, log_n: int = DEFAULT_LOG_N) -> str:
    salt = os.urandom(_SALT_LEN)
    key = _scrypt(password, salt, log_n, DEFAULT_R, DEFAULT_P)
    return f"$scrypt$ln={log_n},r={DEFAULT_R},p={DEFAULT_P}${_b64(salt)}${_b64(key)}"


def check_hash(encoded: str) -> None:
    """Raise ValueError unless ``encoded`` is a hash this module can verify."""
    _parse(encoded)


def _parse(encoded: str) -> tuple[int, int, int, bytes, bytes]:
    parts = encoded.split("$")
    if len(parts) != 5 or parts[0] or parts[1] != "scrypt":
        raise ValueError("not a $scrypt$ hash")
    params = dict(item.split("=", 1) for item in parts[2].split(","))
    log_n, r, p = int(params["ln"]), int(params["r"]), int(params["p"])
    if not (1 <= log_n <= 20 and 1 <= r <= 32 and 1 <= p <= 16):
        raise ValueError("scrypt parameters out of range")
    return log_n, r, p, _unb64(parts[3]), _unb64(parts[4])


def verify_password(password: str, encoded: str) -> bool:
    """Constant-time comparison of the derived key (``hmac.compare_digest``)."""
    try:
        log_n, r, p, salt, key = _parse(encoded)
    except (ValueError, KeyError):
        return False
    return hmac.compare_digest(_scrypt(password, salt, log_n, r, p), key)


@functools.cache
def dummy_hash() -> str:
    """Verified against when the user does not exist, so that an unknown name costs as much
    time as a wrong password (no user enumeration by timing)."""
    return hash_password("not a password")
