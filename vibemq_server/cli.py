"""``vibemq-server``: parse flags, load the config (file < env < flags), run until a signal."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import structlog
import uvloop
from pydantic import ValidationError

from vibemq_server import __version__
from vibemq_server.app import create_broker
from vibemq_server.auth import InsecureDefault, UsersFileError
from vibemq_server.auth.cli import main as users_main
from vibemq_server.buildinfo import describe as describe_build
from vibemq_server.buildinfo import stale_modules
from vibemq_server.config import Config, load_config
from vibemq_server.journal import JournalCorrupt
from vibemq_server.logs import configure_logging
from vibemq_server.server.allocator import tune_allocator
from vibemq_server.server.fdlimit import connection_capacity, raise_open_files
from vibemq_server.server.sdnotify import Notifier

log = structlog.get_logger("vibemq")
_GC_GEN0_THRESHOLD = 50_000


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vibemq-server",
        description="VibeMQ message broker. Settings: config file < VIBEMQ_* env < these flags.",
        epilog="Users: vibemq-server users add|delete|passwd|list|tag|permit (see --help there).",
    )
    p.add_argument(
        "--version", action="version", version=f"vibemq-server {__version__} ({describe_build()})"
    )
    p.add_argument("--config", type=Path, help="TOML config file (env VIBEMQ_CONFIG)")
    p.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="VibeMQ port (default 2925; 0 = any free port)")
    p.add_argument("--data-dir", type=Path, help="directory for persistent data (default ./data)")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    p.add_argument("--log-format", choices=["json", "console"])
    # Tokens are secrets: never on the command line (any local user reads argv from ps), so
    # the flag names a file; the environment (VIBEMQ_AUTH_TOKENS) and the config file work too.
    p.add_argument(
        "--auth-tokens-file",
        type=Path,
        metavar="PATH",
        help="file of accepted client tokens, one TOKEN or TOKEN:USER per line (a bare one is "
        "default_token_user's; # comments)",
    )
    p.add_argument(
        "--users-file",
        type=Path,
        help="users file (default <data-dir>/users.json); edit with `vibemq-server users`",
    )
    p.add_argument(
        "--allow-anonymous",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="accept clients without credentials from anywhere (--no-allow-anonymous: never); "
        "default: from loopback only, and only while no user or token is configured",
    )
    p.add_argument(
        "--fsync",
        choices=["always", "interval", "never"],
        help="journal durability: fsync before PublishAck, every --fsync-interval, or never",
    )
    p.add_argument("--fsync-interval", type=int, dest="fsync_interval_ms", metavar="MS")
    p.add_argument("--segment-size", type=int, dest="segment_size_bytes", metavar="BYTES")
    p.add_argument("--max-connections", type=int)
    p.add_argument("--max-message-size", type=int, help="frame body bytes (default 86 MiB)")
    p.add_argument("--publish-rate-limit", type=float, help="publishes/s per client (0 = off)")
    p.add_argument("--keepalive-timeout", type=float, dest="keepalive_timeout_s", metavar="S")
    p.add_argument("--drain-timeout", type=float, dest="drain_timeout_s", metavar="S")
    p.add_argument(
        "--mqtt-port", type=int, help="MQTT 3.1/3.1.1 port (default 1883; 0 = any free port)"
    )
    p.add_argument("--no-mqtt", action="store_true", help="do not open the MQTT listener")
    p.add_argument(
        "--mqtt-ws-port",
        type=int,
        help="MQTT over WebSockets, path /mqtt (default: off; 0 = any free port)",
    )
    p.add_argument(
        "--amqp-port", type=int, help="AMQP 0-9-1 port (default 5672; 0 = any free port)"
    )
    p.add_argument("--no-amqp", action="store_true", help="do not open the AMQP listener")
    p.add_argument(
        "--http-port",
        type=int,
        help="management HTTP port (default 2927; 0 = any free port); docs/management.md",
    )
    p.add_argument("--no-http", action="store_true", help="do not open the HTTP listener")
    p.add_argument(
        "--zmq-pull",
        metavar="ENDPOINT",
        help="bind a ZeroMQ PULL socket here, e.g. tcp://127.0.0.1:5557 (default: off)",
    )
    p.add_argument(
        "--zmq-pub",
        metavar="ENDPOINT",
        help="bind a ZeroMQ PUB socket here, e.g. tcp://127.0.0.1:5558 (default: off)",
    )
    tls = p.add_argument_group("TLS (docs/security.md): listeners open when --tls-cert is given")
    tls.add_argument("--tls-cert", type=Path, metavar="PEM", help="server certificate chain")
    tls.add_argument("--tls-key", type=Path, metavar="PEM", help="its key (default: in --tls-cert)")
    tls.add_argument("--tls-ca", type=Path, metavar="PEM", help="CAs of client certificates")
    tls.add_argument(
        "--tls-require-client-cert",
        action="store_true",
        default=None,
        help="refuse clients without a certificate signed by --tls-ca",
    )
    tls.add_argument("--tls-min-version", choices=["1.2", "1.3"], help="default 1.2")
    tls.add_argument(
        "--tls-port", type=int, help="VibeMQ over TLS (default 2926; 0 = any free port)"
    )
    tls.add_argument("--mqtt-tls-port", type=int, help="MQTT over TLS (default 8883)")
    tls.add_argument(
        "--mqtt-wss-port", type=int, help="MQTT over secure WebSockets, wss (default: off)"
    )
    tls.add_argument("--amqp-tls-port", type=int, help="AMQP over TLS, amqps (default 5671)")
    tls.add_argument("--http-tls-port", type=int, help="HTTPS management (default 2928)")
    tls.add_argument("--no-plain-port", action="store_true", help="no plain VibeMQ listener")
    tls.add_argument("--no-mqtt-plain", action="store_true", help="no plain MQTT listener")
    tls.add_argument("--no-amqp-plain", action="store_true", help="no plain AMQP listener")
    tls.add_argument(
        "--use-identity-as-username",
        action="store_true",
        default=None,
        help="MQTT over TLS: the client certificate's CN is the username",
    )
    p.add_argument(
        "--ready-file",
        type=Path,
        help='write {"vibemq": port, ...} here once listening (for scripts using port 0)',
    )
    return p


#: flag -> (config section, field): a flag given sets that field of that section
_SECTION_FLAGS: dict[str, tuple[str, str]] = {
    "mqtt_port": ("mqtt", "port"),
    "mqtt_ws_port": ("mqtt", "ws_port"),
    "mqtt_wss_port": ("mqtt", "wss_port"),
    "amqp_port": ("amqp", "port"),
    "http_port": ("http", "port"),
    "http_tls_port": ("http", "tls_port"),
    "zmq_pull": ("zmq", "pull"),
    "zmq_pub": ("zmq", "pub"),
    "tls_cert": ("tls", "cert_file"),
    "tls_key": ("tls", "key_file"),
    "tls_ca": ("tls", "ca_file"),
    "tls_require_client_cert": ("tls", "require_client_cert"),
    "tls_min_version": ("tls", "min_version"),
    "tls_port": ("tls", "port"),
    "mqtt_tls_port": ("tls", "mqtt_port"),
    "amqp_tls_port": ("tls", "amqp_port"),
    "use_identity_as_username": ("tls", "use_identity_as_username"),
}
#: switch -> (config section, field) that it turns off
_OFF_FLAGS: dict[str, tuple[str, str]] = {
    "no_mqtt": ("mqtt", "enabled"),
    "no_amqp": ("amqp", "enabled"),
    "no_http": ("http", "enabled"),
    "no_plain_port": ("tls", "plain_vibemq"),
    "no_mqtt_plain": ("tls", "plain_mqtt"),
    "no_amqp_plain": ("tls", "plain_amqp"),
}
#: what is not a top-level setting of the same name
_NOT_CONFIG = {"config", "auth_tokens_file", "ready_file", *_SECTION_FLAGS, *_OFF_FLAGS}


def config_from_args(args: argparse.Namespace, environ: dict[str, str]) -> Config:
    overrides: dict[str, Any] = {
        k: v for k, v in vars(args).items() if v is not None and k not in _NOT_CONFIG
    }
    sections: dict[str, dict[str, Any]] = {}
    for flag, (section, field) in _SECTION_FLAGS.items():
        value = getattr(args, flag)
        if value is not None:
            sections.setdefault(section, {})[field] = value
    for flag, (section, field) in _OFF_FLAGS.items():
        if getattr(args, flag):
            sections.setdefault(section, {})[field] = False
    overrides.update(sections)
    if args.auth_tokens_file is not None:
        overrides["auth_tokens"] = read_tokens_file(args.auth_tokens_file)
    path = args.config or (Path(environ["VIBEMQ_CONFIG"]) if environ.get("VIBEMQ_CONFIG") else None)
    return load_config(path, environ, overrides)


def read_tokens_file(path: Path) -> list[str]:
    """The tokens of ``--auth-tokens-file``: one per line, blank lines and # comments left out."""
    lines = (line.strip() for line in path.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line and not line.startswith("#")]


async def serve(config: Config, ready_file: Path | None = None) -> None:
    # Every message allocates a few container objects; with the default gen-0 threshold
    # (700) the cyclic collector runs thousands of times a second. Messages do not form
    # cycles, so collect far less often, and keep start-up objects out of its way.
    gc.collect()
    gc.freeze()
    gc.set_threshold(_GC_GEN0_THRESHOLD, 20, 20)
    open_files, _hard = raise_open_files()
    allocator_tuned = tune_allocator(os.environ)
    broker = create_broker(config)
    await broker.start()
    log.info(
        "started",
        version=__version__,
        build=describe_build(),
        open_files=open_files,
        connection_capacity=connection_capacity(open_files, config.max_connections),
        allocator_tuned=allocator_tuned,
    )
    if connection_capacity(open_files, config.max_connections) < config.max_connections:
        log.warning(
            "the open-file limit allows fewer connections than max_connections",
            open_files=open_files,
            max_connections=config.max_connections,
        )
    if stale := stale_modules():
        log.warning("compiled modules older than their source: rebuild them", modules=stale)
    # The stop signals are ours before anyone is told we are ready: a SIGTERM sent right
    # after the ready file appeared killed the process outright (exit -15) under load.
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    ready = broker.ready()
    if ready_file is not None:
        tmp = ready_file.with_suffix(".tmp")
        # Bound ports and endpoints (a port 0 resolved), for tests and scripts.
        if "mqtt" not in ready:
            ready["mqtt"] = None
        if "amqp" not in ready:
            ready["amqp"] = None
        for key in (
            "vibemq_tls",
            "mqtt_tls",
            "mqtt_ws",
            "mqtt_wss",
            "amqp_tls",
            "http",
            "http_tls",
        ):
            ready.setdefault(key, None)
        tmp.write_text(json.dumps(ready))
        tmp.replace(ready_file)
    # systemd (Type=notify): ready at the moment the ready file is, i.e. journal recovered
    # and every listener up.
    notifier = Notifier()
    status = listening_status(ready)
    notifier.ready(status)

    def reload() -> None:
        # SIGHUP: the users file is re-read, new TLS handshakes use the certificate files as
        # they are now.
        notifier.reloading()
        try:
            broker.reload()
        finally:
            notifier.ready(status)

    loop.add_signal_handler(signal.SIGHUP, reload)
    await stop.wait()
    notifier.stopping()
    await broker.stop()


def listening_status(ready: dict[str, int | str | None]) -> str:
    """systemd's STATUS= line: what listens where (``systemctl status`` shows it)."""
    bound = ", ".join(f"{key} {value}" for key, value in ready.items() if value is not None)
    return f"listening: {bound}" if bound else "running"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["users"]:
        return users_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(args, dict(os.environ))
    except (ValidationError, OSError, ValueError) as exc:
        print(f"vibemq-server: invalid configuration: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.log_level, config.log_format)
    try:
        config.data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"vibemq-server: cannot use data dir {config.data_dir}: {exc}", file=sys.stderr)
        return 2
    try:
        uvloop.run(serve(config, args.ready_file))
    except (InsecureDefault, UsersFileError) as exc:
        log.error("cannot start", error=str(exc))
        print(f"vibemq-server: {exc}", file=sys.stderr)
        return 2
    except (OSError, JournalCorrupt) as exc:
        log.error("cannot start", error=str(exc))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
