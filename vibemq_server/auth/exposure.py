"""Secure by default (Mosquitto 2.0's rule): no anonymous access from the network unless
asked for. A broker without any credentials refuses to listen on a non-loopback address
unless ``allow_anonymous = true`` says that is meant."""

from __future__ import annotations

import functools
import ipaddress
import socket

from vibemq_server.config import Config


class InsecureDefault(ValueError):
    """The configuration would open the broker to anonymous clients from the network."""


# Remembered: every anonymous login asks it of its peer's address (parsing one costs more
# than the rest of an MQTT CONNECT's login), and clients come back from the same few.
@functools.lru_cache(maxsize=4096)
def is_loopback_peer(host: str) -> bool:
    """A peer's address (as the socket reports it) is a loopback one (IPv4-mapped too)."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def is_loopback_host(host: str) -> bool:
    """A listening host is loopback only: an address, or a name all of whose addresses are."""
    if not host:
        return False  # "" binds every interface
    try:
        return is_loopback_peer(str(ipaddress.ip_address(host)))
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    return bool(infos) and all(is_loopback_peer(str(info[4][0])) for info in infos)


def listen_hosts(config: Config) -> dict[str, str]:
    """listener -> the host it binds (the stream listeners that authenticate clients)."""
    hosts = {"vibemq": config.host}
    if config.mqtt.enabled:
        hosts["mqtt"] = config.mqtt.host or config.host
    if config.amqp.enabled:
        hosts["amqp"] = config.amqp.host or config.host
    return hosts


def check_exposure(config: Config, credentials_configured: bool) -> None:
    """Raise InsecureDefault when a listener would take anonymous clients from the network."""
    if config.allow_anonymous is not None or credentials_configured:
        return
    exposed = {
        name: host for name, host in listen_hosts(config).items() if not is_loopback_host(host)
    }
    if not exposed:
        return
    where = ", ".join(f"{name} on {host or '*'}" for name, host in exposed.items())
    raise InsecureDefault(
        f"refusing to start: {where} would accept anonymous clients from the network, and "
        "no users or tokens are configured. Fix it with one of: add a user "
        f"(vibemq-server users --users-file {config.users_path} add NAME), give a token "
        "(--auth-tokens-file or VIBEMQ_AUTH_TOKENS), allow anonymous clients on purpose "
        "(--allow-anonymous, allow_anonymous = true or VIBEMQ_ALLOW_ANONYMOUS=true), or "
        "listen on 127.0.0.1 only."
    )
