"""The real ``vibemq-server`` process (signals, ready file, JSON logs) and config precedence."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from rawclient import RawClient, assert_error, assert_ok
from serverproc import clean_env, launch, tokens_file

from vibemq_server.cli import build_parser, config_from_args
from vibemq_server.config import Config, DeliveryMode, OverflowStrategy, load_config
from vibemq_server.protocol import CommandType

T = CommandType
REPO = Path(__file__).resolve().parents[2]
DEFAULT_TOML = REPO / "config" / "vibemq.toml"


@dataclass
class ServerProcess:
    proc: asyncio.subprocess.Process
    port: int
    stderr_task: asyncio.Task[bytes]

    async def stop(self, timeout: float = 10.0) -> tuple[int, str]:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = await asyncio.wait_for(self.proc.wait(), timeout)
        err = await asyncio.wait_for(self.stderr_task, timeout)
        return rc, err.decode(errors="replace")


async def start_server(
    tmp_path: Path, *flags: str, env: dict[str, str] | None = None
) -> ServerProcess:
    proc, info, stderr_task = await launch(tmp_path, tmp_path / "data", *flags, env=env)
    port = info["vibemq"]
    assert isinstance(port, int) and port > 0
    return ServerProcess(proc, port, stderr_task)


@pytest.fixture
async def servers() -> AsyncIterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    yield started
    for s in started:
        if s.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                s.proc.kill()
            await s.proc.wait()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(s.stderr_task, 5)


def json_log_lines(stderr: str) -> list[dict[str, object]]:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines, "the server logged nothing"
    parsed = [json.loads(line) for line in lines]  # every line is a JSON object
    assert all(isinstance(p, dict) for p in parsed)
    return parsed


# -- the process -----------------------------------------------------------------------------------


async def test_sigterm_sends_server_shutdown_and_exits_zero(
    tmp_path: Path, servers: list[ServerProcess]
) -> None:
    server = await start_server(tmp_path, "--drain-timeout", "5")
    servers.append(server)
    assert (tmp_path / "data").is_dir()
    sub = await RawClient.connected(server.port)
    assert_ok(await sub.subscribe("jobs"), T.SUBSCRIBE_ACK)
    pub = await RawClient.connected(server.port)
    assert_ok(await pub.publish("jobs", {"n": 1}, msg_id="job_1"), T.PUBLISH_ACK)
    assert (await sub.delivery("jobs")).id == "job_1"

    loop = asyncio.get_running_loop()
    t0 = loop.time()
    server.proc.send_signal(signal.SIGTERM)
    for c in (sub, pub):
        bye = await c.recv_type(T.DISCONNECT)
        assert bye.headers["reason"] == "server_shutdown"
        await c.wait_closed()
    rc, stderr = await server.stop(timeout=7)
    assert rc == 0, stderr
    assert loop.time() - t0 < 5.0
    logs = json_log_lines(stderr)
    events = [entry.get("event") for entry in logs]
    assert "listening" in events
    assert "shutting down" in events
    assert all("level" in entry and "timestamp" in entry for entry in logs)
    listening = next(
        e for e in logs if e.get("event") == "listening" and e.get("protocol") == "vibemq"
    )
    assert listening["port"] == server.port


async def test_sigterm_with_a_silent_client_exits_within_drain_time(
    tmp_path: Path, servers: list[ServerProcess]
) -> None:
    """A client that never reads still cannot keep the server up past the drain timeout."""
    server = await start_server(tmp_path, "--drain-timeout", "1")
    servers.append(server)
    c = await RawClient.connected(server.port)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    rc, stderr = await server.stop(timeout=6)
    assert rc == 0, stderr
    assert loop.time() - t0 < 4.0
    await c.close()


async def test_sigint_also_stops_cleanly(tmp_path: Path, servers: list[ServerProcess]) -> None:
    server = await start_server(tmp_path)
    servers.append(server)
    server.proc.send_signal(signal.SIGINT)
    rc, stderr = await server.stop()
    assert rc == 0, stderr


async def test_auth_tokens_file_turns_auth_on(tmp_path: Path, servers: list[ServerProcess]) -> None:
    server = await start_server(tmp_path, "--auth-tokens-file", tokens_file(tmp_path, "x"))
    servers.append(server)
    c = await RawClient.open(server.port)
    assert_error(await c.connect(msg_id="c_noauth"), "AUTH_REQUIRED", "c_noauth")
    await c.wait_closed()
    c = await RawClient.open(server.port)
    assert_error(await c.connect("y"), "AUTH_FAILED")
    await c.wait_closed()
    ok = await RawClient.connected(server.port, token="x")
    assert_ok(await ok.ping(), T.PONG)
    rc, _ = await server.stop()
    assert rc == 0


async def test_env_configures_the_process_and_flags_win(
    tmp_path: Path, servers: list[ServerProcess]
) -> None:
    # VIBEMQ_PORT would be a fixed port, but the --port 0 flag wins over it.
    env = clean_env(VIBEMQ_PORT="1", VIBEMQ_AUTH_TOKENS="a,b", VIBEMQ_LOG_FORMAT="console")
    server = await start_server(tmp_path, env=env)
    servers.append(server)
    assert server.port != 1
    c = await RawClient.open(server.port)
    assert_error(await c.connect(), "AUTH_REQUIRED")
    ok = await RawClient.connected(server.port, token="b")
    assert_ok(await ok.ping(), T.PONG)
    rc, stderr = await server.stop()
    assert rc == 0
    json_log_lines(stderr)  # --log-format json beat VIBEMQ_LOG_FORMAT=console


async def test_invalid_configuration_exits_2(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "vibemq_server",
        "--port",
        "0",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=clean_env(VIBEMQ_MAX_CONNECTIONS="zero"),
        cwd=tmp_path,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 15)
    assert proc.returncode == 2
    assert b"invalid configuration" in err


# -- config precedence -----------------------------------------------------------------------------


def cfg(argv: list[str], environ: dict[str, str] | None = None) -> Config:
    return config_from_args(build_parser().parse_args(argv), environ or {})


@pytest.fixture
def toml_file(tmp_path: Path) -> Path:
    path = tmp_path / "vibemq.toml"
    path.write_text(
        'port = 1111\nhost = "0.0.0.0"\nlog_level = "debug"\n'
        "[queue_defaults]\nmax_queue_size = 77\nmax_retry_attempts = 9\n"
    )
    return path


def test_precedence_file_env_flags(toml_file: Path) -> None:
    assert cfg([]).port == 2925
    assert cfg(["--config", str(toml_file)]).port == 1111
    env = {"VIBEMQ_PORT": "2222"}
    assert cfg(["--config", str(toml_file)], env).port == 2222
    assert cfg(["--config", str(toml_file), "--port", "3333"], env).port == 3333
    assert cfg(["--port", "3333"], env).port == 3333
    # Settings not overridden keep the file's values.
    full = cfg(["--config", str(toml_file), "--port", "3333"], env)
    assert (full.host, full.log_level) == ("0.0.0.0", "debug")


def test_config_file_from_env_variable(toml_file: Path) -> None:
    env = {"VIBEMQ_CONFIG": str(toml_file)}
    assert cfg([], env).port == 1111
    assert cfg([], {**env, "VIBEMQ_PORT": "2222"}).port == 2222
    other = toml_file.with_name("other.toml")
    other.write_text("port = 4444\n")
    assert cfg(["--config", str(other)], env).port == 4444  # the flag names the file


def test_nested_env_merges_with_file(toml_file: Path) -> None:
    env = {
        "VIBEMQ_QUEUE_DEFAULTS__MAX_QUEUE_SIZE": "500",
        "VIBEMQ_QUEUE_DEFAULTS__OVERFLOW_STRATEGY": "BlockPublisher",
    }
    c = load_config(toml_file, env)
    assert c.queue_defaults.max_queue_size == 500
    assert c.queue_defaults.overflow_strategy is OverflowStrategy.BLOCK_PUBLISHER
    assert c.queue_defaults.max_retry_attempts == 9  # from the file, untouched
    assert c.queue_defaults.delivery_mode is DeliveryMode.ROUND_ROBIN
    assert load_config(None, env).queue_defaults.max_queue_size == 500


def test_auth_tokens_from_env_and_a_file(tmp_path: Path) -> None:
    assert cfg([], {"VIBEMQ_AUTH_TOKENS": "a,b"}).auth_tokens == ["a", "b"]
    assert cfg([], {"VIBEMQ_AUTH_TOKENS": " a , b ,"}).auth_tokens == ["a", "b"]
    assert cfg([], {"VIBEMQ_AUTH_TOKENS": '["a,1", "b"]'}).auth_tokens == ["a,1", "b"]
    path = tokens_file(tmp_path, "x", "", "  y:bob  ", "# a comment")
    flagged = cfg(["--auth-tokens-file", path], {"VIBEMQ_AUTH_TOKENS": "a,b"})
    assert flagged.auth_tokens == ["x", "y:bob"]
    assert flagged.auth_enabled
    assert not cfg([]).auth_enabled


def test_env_values_are_typed_and_validated() -> None:
    env = {
        "VIBEMQ_PUBLISH_RATE_LIMIT": "2.5",
        "VIBEMQ_AUTO_CREATE_QUEUES": "false",
        "VIBEMQ_KEEPALIVE_TIMEOUT_S": "7",
        "VIBEMQ_HEALTHCHECK_URL": "ignored",
        "VIBEMQ_NOT_A_SETTING": "ignored",
    }
    c = cfg(["--keepalive-timeout", "8"], env)
    assert c.publish_rate_limit == 2.5
    assert c.auto_create_queues is False
    assert c.keepalive_timeout_s == 8.0
    with pytest.raises(ValueError):
        cfg([], {"VIBEMQ_PORT": "70000"})


def test_default_toml_equals_model_defaults() -> None:
    assert load_config(DEFAULT_TOML) == Config()
    assert cfg(["--config", str(DEFAULT_TOML)]) == Config()
