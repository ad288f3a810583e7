"""The broker's one server-side TLS context, built from ``[tls]``, and what a handshake tells.

Every TLS listener (native, MQTT, AMQP) shares the context ``server_context`` builds. On
SIGHUP ``reload`` loads the certificate chain again into that same context: handshakes that
start afterwards use the new certificate, connections already open keep theirs.
"""

from __future__ import annotations

import ssl
from typing import Any

import structlog

from vibemq_server.config import TlsConfig

log = structlog.get_logger("vibemq.tls")

_MIN_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}


def server_context(cfg: TlsConfig) -> ssl.SSLContext | None:
    """The context of the TLS listeners, or None when no certificate is configured. Raises
    ``OSError`` (``ssl.SSLError`` is one) for a file that is missing or unusable."""
    if cfg.cert_file is None:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    # TLS 1.0 and 1.1 are refused whatever the system's OpenSSL policy allows.
    ctx.minimum_version = _MIN_VERSIONS[cfg.min_version]
    # Compression invites CRIME; renegotiation by a client is a denial-of-service lever.
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
    try:
        _load(ctx, cfg)
    except (OSError, ValueError) as exc:
        raise OSError(f"TLS: cannot load {_files(cfg)}: {exc}") from exc
    if cfg.ca_file is not None:
        ctx.verify_mode = ssl.CERT_REQUIRED if cfg.require_client_cert else ssl.CERT_OPTIONAL
    return ctx


def _load(ctx: ssl.SSLContext, cfg: TlsConfig) -> None:
    assert cfg.cert_file is not None
    ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    if cfg.ca_file is not None:
        ctx.load_verify_locations(cafile=cfg.ca_file)


def _files(cfg: TlsConfig) -> str:
    named = {"cert_file": cfg.cert_file, "key_file": cfg.key_file, "ca_file": cfg.ca_file}
    return ", ".join(f"{k} {v}" for k, v in named.items() if v is not None)


def reload(ctx: ssl.SSLContext, cfg: TlsConfig) -> bool:
    """Load the certificate, key and CA files again into ``ctx`` (new handshakes use them).
    A file that cannot be used is logged and the certificate in use kept."""
    try:
        # Tried on a scratch context first: a certificate that loads with a key that does not
        # match it would otherwise leave the live context half replaced.
        _load(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), cfg)
        _load(ctx, cfg)
    except (OSError, ValueError) as exc:
        log.error(
            "TLS certificates not reloaded, the old ones stay", files=_files(cfg), error=str(exc)
        )
        return False
    log.info("TLS certificates reloaded", cert_file=str(cfg.cert_file))
    return True


def peer_identity(cert: dict[str, Any] | None) -> str | None:
    """A verified client certificate's identity: its subject CN, else its first SAN."""
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and value:
                return str(value)
    for _kind, value in cert.get("subjectAltName", ()):
        if value:
            return str(value)
    return None


def describe(error: BaseException) -> str:
    """A handshake failure in a few words, for the log line (OpenSSL's reason code)."""
    if isinstance(error, ssl.SSLError):
        reason = error.reason or ""
        if isinstance(error, ssl.SSLCertVerificationError):
            return f"{reason}: {error.verify_message}" if reason else error.verify_message
        if reason:
            return str(reason)
    return str(error) or type(error).__name__
