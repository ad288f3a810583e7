"""Broker configuration: pydantic models, loaded from a TOML file, VIBEMQ_* env, then CLI flags.

Precedence, lowest first: model defaults (which equal ``config/vibemq.toml``), the config
file, ``VIBEMQ_*`` environment variables, command-line flags. Nested settings use a double
underscore in the environment: ``VIBEMQ_QUEUE_DEFAULTS__MAX_QUEUE_SIZE=500``.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

ENV_PREFIX = "VIBEMQ_"


class DeliveryMode(StrEnum):
    ROUND_ROBIN = "RoundRobin"
    FAN_OUT_WITH_ACK = "FanOutWithAck"
    FAN_OUT_WITHOUT_ACK = "FanOutWithoutAck"
    PRIORITY_BASED = "PriorityBased"


class OverflowStrategy(StrEnum):
    DROP_OLDEST = "DropOldest"
    DROP_NEWEST = "DropNewest"
    BLOCK_PUBLISHER = "BlockPublisher"
    REDIRECT_TO_DLQ = "RedirectToDlq"


class QueueDefaults(BaseModel):
    """Options a queue gets when they are not given at creation (auto-created queues too)."""

    model_config = ConfigDict(extra="forbid")

    delivery_mode: DeliveryMode = DeliveryMode.ROUND_ROBIN
    max_queue_size: int = Field(10_000, ge=1)
    message_ttl_ms: int = Field(0, ge=0, description="0 = messages never expire")
    enable_dead_letter_queue: bool = False
    max_retry_attempts: int = Field(3, ge=1)
    ack_timeout_ms: int = Field(30_000, ge=1)
    overflow_strategy: OverflowStrategy = OverflowStrategy.DROP_OLDEST
    durable: bool = True


#: the default of ``mqtt.ws_allowed_origins``: pages served from this machine's loopback
#: names only, so that a page of another site open in a browser here cannot drive the broker
LOOPBACK_ORIGINS = tuple(
    f"{scheme}://{host}:*"
    for host in ("localhost", "127.0.0.1", "[::1]")
    for scheme in ("http", "https")
)


class MqttConfig(BaseModel):
    """The MQTT 3.1 / 3.1.1 listener (see docs/mqtt.md)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    host: str | None = Field(None, description="None = the broker's host")
    port: int = Field(1883, ge=0, le=65535)
    ws_port: int | None = Field(
        None, ge=0, le=65535, description="MQTT over WebSockets (/mqtt); 0 = any; None = off"
    )
    wss_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="MQTT over secure WebSockets (needs tls.cert_file); 0 = any; None = off",
    )
    max_packet_size: int = Field(
        64 * 1024 * 1024 + 64 * 1024,
        ge=64,
        le=268_435_460,
        description="a 64 MiB payload plus room for topic and properties (docs/operations.md)",
    )
    max_inflight: int = Field(1000, ge=1, le=65_535, description="QoS 1/2 deliveries unacked")
    max_queued_messages: int = Field(
        1000, ge=1, description="per session, beyond those in flight; newer ones are dropped"
    )
    pause_publishers_bytes: int = Field(
        8 * 1024 * 1024,
        ge=1,
        description="a subscriber with this many payload bytes waiting for it in memory pauses "
        "its publishers until half of it is left (as half max_queued_messages does)",
    )
    max_publisher_pause_s: float = Field(
        1.0, gt=0, description="longest a publisher waits for slow subscribers before drops"
    )
    max_client_id_length: int = Field(1024, ge=23, le=16_384)
    receive_maximum: int = Field(
        1000, ge=1, le=65_535, description="MQTT 5: QoS 2 publishes a client may leave unreleased"
    )
    topic_alias_maximum: int = Field(
        1024, ge=0, le=65_535, description="MQTT 5: topic aliases a client may set"
    )
    server_keep_alive: int = Field(
        0, ge=0, le=65_535, description="MQTT 5: longest keep-alive (s) a client gets; 0 = its own"
    )
    response_information: str = Field(
        "",
        max_length=1024,
        description="MQTT 5: the Response Information a client asking for it gets, "
        "'%c' replaced by its client id (e.g. 'reply/%c/'); '' = none",
    )
    server_reference: str = Field(
        "",
        max_length=1024,
        description="MQTT 5: another server for clients (e.g. 'mqtt2.example.com:1883'); '' = none",
    )
    server_reference_mode: Literal["shutdown", "use_another", "moved"] = Field(
        "shutdown",
        description="MQTT 5, with server_reference: 'shutdown' = DISCONNECT 0x9C with it when "
        "the broker stops; 'use_another' / 'moved' = refuse every v5 CONNECT with CONNACK "
        "0x9C / 0x9D and it",
    )
    ws_allowed_origins: list[str] = Field(
        default_factory=lambda: list(LOOPBACK_ORIGINS),
        description="WebSocket handshakes whose Origin matches one of these patterns "
        "('scheme://host:port', fnmatch: '*' = any run; '*' alone = every origin; 'null'); "
        "others get 403. A request without Origin (not a browser) is always let in",
    )
    max_retained: int = Field(100_000, ge=0)
    connect_timeout_s: float = Field(10.0, gt=0)
    users: dict[str, str] = Field(default_factory=dict, description="username -> password")
    deny_subscribe: list[str] = Field(default_factory=list, description="topic filters")
    deny_publish: list[str] = Field(default_factory=list, description="topic filters")
    sys_interval_s: float = Field(
        10.0, ge=0, description="$SYS/broker/... topics are published this often; 0 = never"
    )


class MetricsConfig(BaseModel):
    """The Prometheus exposition (see docs/monitoring.md)."""

    model_config = ConfigDict(extra="forbid")

    per_queue_limit: int = Field(
        100,
        ge=-1,
        description="per-queue series for the N deepest queues only; 0 = none, -1 = all",
    )


class AmqpConfig(BaseModel):
    """The AMQP 0-9-1 listener (see docs/amqp.md)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    host: str | None = Field(None, description="None = the broker's host")
    port: int = Field(5672, ge=0, le=65535)
    frame_max: int = Field(131_072, ge=4096, le=1024 * 1024)
    channel_max: int = Field(2047, ge=1, le=65_535)
    heartbeat_s: int = Field(60, ge=0, le=65_535, description="proposed in connection.tune")
    max_message_size: int = Field(
        64 * 1024 * 1024, ge=1024, description="body bytes; larger: channel error 406"
    )
    handshake_timeout_s: float = Field(10.0, gt=0)


class ZmqConfig(BaseModel):
    """The ZeroMQ bridge (see docs/zmq.md): off unless an endpoint is given."""

    model_config = ConfigDict(extra="forbid")

    pull: str | None = Field(
        None, min_length=1, description="endpoint the PULL socket binds; None = no PULL"
    )
    pub: str | None = Field(
        None, min_length=1, description="endpoint the PUB socket binds; None = no PUB"
    )
    sndhwm: int = Field(
        1000, ge=1, description="messages queued per SUB peer; beyond, ZeroMQ drops them"
    )
    rcvhwm: int = Field(1000, ge=1, description="messages the PULL socket queues")
    batch: int = Field(256, ge=1, le=100_000, description="PULL messages handled per loop turn")
    user: str | None = Field(
        None,
        min_length=1,
        description="the user PULL publishes as (its write permission applies); None = anonymous",
    )

    @property
    def enabled(self) -> bool:
        return self.pull is not None or self.pub is not None


class TlsConfig(BaseModel):
    """TLS listeners next to the plain ones (see docs/security.md): on when ``cert_file`` is
    set. Each plain listener can be turned off for a TLS-only deployment."""

    model_config = ConfigDict(extra="forbid")

    cert_file: Path | None = Field(None, description="server certificate chain (PEM)")
    key_file: Path | None = Field(None, description="its private key (PEM); None = in cert_file")
    ca_file: Path | None = Field(None, description="CAs that sign client certificates (PEM)")
    require_client_cert: bool = False
    min_version: Literal["1.2", "1.3"] = "1.2"
    handshake_timeout_s: float = Field(10.0, gt=0)
    port: int = Field(2926, ge=0, le=65535, description="native VibeMQ over TLS")
    mqtt_port: int = Field(8883, ge=0, le=65535)
    amqp_port: int = Field(5671, ge=0, le=65535)
    plain_vibemq: bool = Field(True, description="False = no plain VibeMQ listener")
    plain_mqtt: bool = Field(True, description="False = no plain MQTT listener")
    plain_amqp: bool = Field(True, description="False = no plain AMQP listener")
    use_identity_as_username: bool = Field(
        False, description="MQTT over TLS: the client certificate's CN is the username"
    )

    @property
    def enabled(self) -> bool:
        return self.cert_file is not None

    @model_validator(mode="after")
    def _consistent(self) -> TlsConfig:
        if self.require_client_cert and self.ca_file is None:
            raise ValueError("tls.require_client_cert needs tls.ca_file")
        plain_off = not (self.plain_vibemq and self.plain_mqtt and self.plain_amqp)
        if plain_off and self.cert_file is None:
            raise ValueError("a plain listener can be turned off only with tls.cert_file set")
        return self


class HttpConfig(BaseModel):
    """The management HTTP listener: REST API, health, metrics (see docs/management.md).

    On by default, on the broker's host (loopback unless changed). Port 2927 sits next to the
    native ports (2925 plain, 2926 TLS) and collides with neither Mosquitto (1883, 8883, 9001)
    nor RabbitMQ (5672, 5671, 15672, 15692, 25672, 4369)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    host: str | None = Field(None, description="None = the broker's host")
    port: int = Field(2927, ge=0, le=65535, description="plain HTTP; 0 = any free port")
    plain: bool = Field(True, description="False = HTTPS only (needs tls.cert_file)")
    tls_port: int | None = Field(
        2928, ge=0, le=65535, description="HTTPS when tls.cert_file is set; None = no HTTPS"
    )
    open_health: bool = Field(True, description="/health/* answer without credentials")
    open_metrics: bool | None = Field(
        None,
        description="/metrics without credentials: None = from loopback peers only, "
        "true = from anywhere, false = never",
    )
    max_body_bytes: int = Field(
        4 * 1024 * 1024, ge=1024, description="a larger request body is refused with 413"
    )
    request_timeout_s: float = Field(
        10.0, gt=0, description="a request (headers and body) must arrive within this"
    )
    keepalive_timeout_s: int = Field(5, ge=1, description="idle keep-alive connections close")
    max_connections: int = Field(
        256, ge=1, description="concurrent HTTP connections; beyond, 503 (uvicorn)"
    )


class Config(BaseModel):
    """Every broker setting. Defaults are the embedded default config."""

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(2925, ge=0, le=65535)
    data_dir: Path = Path("./data")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["json", "console"] = "console"
    auth_tokens: list[str] = Field(
        default_factory=list,
        description='"token:user" binds a token to a user; a bare token is default_token_user\'s',
    )
    default_token_user: str = Field("admin", min_length=1)
    users_file: Path | None = Field(None, description="None = <data_dir>/users.json")
    allow_anonymous: bool | None = Field(
        None,
        description="None = anonymous clients from loopback only, and only while no user or "
        "token exists; true = from anywhere; false = never",
    )
    auth_failure_delay_s: float = Field(
        0.2, ge=0, description="refusal delay after the 1st failed login of an address; doubles"
    )
    auth_failure_max_delay_s: float = Field(5.0, ge=0)
    connection_rate_limit: float = Field(
        0.0, ge=0, description="new connections/s per source address; 0 = off"
    )
    connection_rate_burst: int = Field(20, ge=1)

    max_connections: int = Field(10_000, ge=1)
    max_message_size: int = Field(
        86 * 1024 * 1024,
        ge=64,
        description="frame body: a 64 MiB binary payload as base64, id, queue and headers",
    )
    max_headers: int = Field(50, ge=0)
    max_header_value: int = Field(4096, ge=1)
    publish_rate_limit: float = Field(0.0, ge=0, description="publishes/s per client; 0 = off")
    keepalive_timeout_s: float = Field(60.0, gt=0)
    frame_timeout_s: float = Field(10.0, gt=0)
    drain_timeout_s: float = Field(30.0, ge=0)
    housekeeping_interval_ms: int = Field(100, ge=1)

    auto_create_queues: bool = True
    default_prefetch: int = Field(1000, ge=1)
    max_prefetch: int = Field(65_535, ge=1)
    memory_high_watermark_bytes: int = Field(512 * 1024 * 1024, ge=1024)
    write_buffer_high_bytes: int = Field(1024 * 1024, ge=4096)
    queue_defaults: QueueDefaults = Field(default_factory=QueueDefaults)
    mqtt: MqttConfig = Field(default_factory=MqttConfig)
    amqp: AmqpConfig = Field(default_factory=AmqpConfig)
    zmq: ZmqConfig = Field(default_factory=ZmqConfig)
    tls: TlsConfig = Field(default_factory=TlsConfig)
    http: HttpConfig = Field(default_factory=HttpConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    users: dict[str, str] = Field(
        default_factory=dict, description="username -> password, for MQTT and AMQP clients"
    )

    fsync: Literal["always", "interval", "never"] = "always"
    fsync_interval_ms: int = Field(10, ge=1)
    segment_size_bytes: int = Field(64 * 1024 * 1024, ge=4096)

    @model_validator(mode="after")
    def _http_consistent(self) -> Config:
        if self.http.enabled and not self.http.plain and self.tls.cert_file is None:
            raise ValueError("http.plain = false (HTTPS only) needs tls.cert_file")
        return self

    @property
    def auth_enabled(self) -> bool:
        """Credentials in the config itself (a users file may hold more: auth package)."""
        return bool(self.auth_tokens or self.users or self.mqtt.users)

    @property
    def users_path(self) -> Path:
        return self.users_file if self.users_file is not None else self.data_dir / "users.json"


#: list settings an environment variable gives as JSON or comma-separated (dotted paths)
_LIST_FIELDS = {"auth_tokens", "mqtt.ws_allowed_origins"}


def _env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """VIBEMQ_* variables as a nested dict; pydantic converts the strings."""
    out: dict[str, Any] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or name.startswith(f"{ENV_PREFIX}HEALTHCHECK"):
            continue
        path = name[len(ENV_PREFIX) :].lower().split("__")
        if path[0] not in Config.model_fields:
            continue
        parsed: Any = value
        if value.startswith("{"):
            parsed = json.loads(value)  # a table: VIBEMQ_USERS='{"alice": "pw"}'
        elif ".".join(path) in _LIST_FIELDS:
            parsed = (
                json.loads(value)
                if value.startswith("[")
                else [v.strip() for v in value.split(",") if v.strip()]
            )
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = parsed
    return out


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(dict(merged[key]), value)
        else:
            merged[key] = value
    return merged


def load_config(
    path: Path | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """File, then environment, then explicit overrides (CLI flags), validated once."""
    data: dict[str, Any] = {}
    if path is not None:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    data = _merge(data, _env_overrides(environ or {}))
    data = _merge(data, overrides or {})
    return Config.model_validate(data)
