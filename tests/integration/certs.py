"""Certificates for the TLS tests, made with ``cryptography``: a CA, a server certificate for
127.0.0.1/localhost, client certificates (good, expired, from another CA), as PEM files."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_DAY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA that signs the server and the good clients
    server: Issued
    alice: Issued  # CN=alice
    bob: Issued  # no CN, SAN email bob@example.com
    expired: Issued  # CN=late, expired yesterday
    foreign: Issued  # CN=mallory, signed by another CA
    foreign_ca: Path
    server2: Issued  # another server certificate, for reloads


class _Ca:
    def __init__(self, name: str) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(self.name)
            .issuer_name(self.name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _DAY)
            .not_valid_after(now + 30 * _DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )

    def issue(
        self,
        directory: Path,
        stem: str,
        cn: str | None,
        sans: list[x509.GeneralName],
        server: bool,
        expired: bool = False,
    ) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        start, end = (now - 10 * _DAY, now - _DAY) if expired else (now - _DAY, now + 30 * _DAY)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)] if cn else [])
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        issued = Issued(directory / f"{stem}.pem", directory / f"{stem}.key")
        issued.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        issued.key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return issued

    def write(self, path: Path) -> Path:
        path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        return path


def make_pki(directory: Path) -> Pki:
    ca, other = _Ca("VibeMQ test CA"), _Ca("Another CA")
    host = [x509.DNSName("localhost"), x509.IPAddress(IPv4Address("127.0.0.1"))]
    return Pki(
        ca=ca.write(directory / "ca.pem"),
        server=ca.issue(directory, "server", "localhost", host, server=True),
        alice=ca.issue(directory, "alice", "alice", [], server=False),
        bob=ca.issue(directory, "bob", None, [x509.RFC822Name("bob@example.com")], server=False),
        expired=ca.issue(directory, "expired", "late", [], server=False, expired=True),
        foreign=other.issue(directory, "foreign", "mallory", [], server=False),
        foreign_ca=other.write(directory / "foreign-ca.pem"),
        server2=ca.issue(directory, "server2", "localhost", host, server=True),
    )


def tls_settings(pki: Pki, **extra: Any) -> dict[str, Any]:
    """A ``[tls]`` section with the test server certificate, every TLS port 0."""
    return {
        "cert_file": pki.server.cert,
        "key_file": pki.server.key,
        "ca_file": pki.ca,
        "port": 0,
        "mqtt_port": 0,
        "amqp_port": 0,
        **extra,
    }
