"""Start and stop the brokers under test on loopback, each in its own process group and
temporary directory. Every wait is bounded."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import BenchError, free_port, group_pids, rss_kib, wait_port

REPO = Path(__file__).resolve().parent.parent


class NotInstalled(BenchError):
    """The broker's executable is not on this machine."""


@functools.cache
def help_text(command: tuple[str, ...]) -> str:
    """``command --help`` (once per command): which flags this build of the server knows."""
    try:
        done = subprocess.run(
            [*command, "--help"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout


class Broker:
    """A broker process group started by the bench (or an external one with ``pid`` known)."""

    name = "broker"

    def __init__(self) -> None:
        self.host = "127.0.0.1"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.tmp: Path | None = None
        self.log_path: Path | None = None
        self.main_pid: int | None = None

    def __enter__(self) -> Broker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        raise NotImplementedError

    def _spawn(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.tmp = self.tmp or Path(tempfile.mkdtemp(prefix=f"bench-{self.name}-"))
        self.log_path = self.tmp / "broker.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                cwd=self.tmp,
            )
        self.main_pid = self.proc.pid

    def log_tail(self, lines: int = 15) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def pids(self) -> list[int]:
        if self.proc is None:
            return [self.main_pid] if self.main_pid else []
        return group_pids(self.proc.pid) or [self.proc.pid]

    def rss_kib(self) -> int | None:
        """Resident set of the broker: the sum over its process group."""
        values = [rss_kib(pid) for pid in self.pids()]
        known = [v for v in values if v is not None]
        return sum(known) if known else None

    def pin(self, cpus: set[int]) -> None:
        """Restrict every thread of the broker's processes to ``cpus`` (threads it starts later
        inherit it from their creator)."""
        for pid in self.pids():
            with contextlib.suppress(OSError):
                for tid in os.listdir(f"/proc/{pid}/task"):
                    with contextlib.suppress(OSError):
                        os.sched_setaffinity(int(tid), cpus)

    def stop(self, grace: float = 15.0) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        # anything left in the group (e.g. erlang children)
        if proc is not None:
            for pid in group_pids(proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.proc = None
        if self.tmp is not None and not os.environ.get("BENCH_KEEP_TMP"):
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None

    def _died(self) -> BenchError:
        return BenchError(f"{self.name} did not start; log tail:\n{self.log_tail()}")


class VibeMQBroker(Broker):
    name = "vibemq"

    def __init__(
        self,
        command: list[str] | None = None,
        extra_args: list[str] | None = None,
        *,
        mqtt: bool = False,
        amqp: bool = False,
        env: dict[str, str] | None = None,
        tls: tuple[Path, Path] | None = None,
        ws: bool = False,
    ):
        """``ws``: also MQTT over WebSockets on a free port (``self.mqtt_ws_port``);
        ``mqtt``/``amqp``: also open the MQTT/AMQP 0-9-1 listener on a free port
        (``self.mqtt_port``/``self.amqp_port``); ``env``: extra environment variables
        (``VIBEMQ_*`` settings) for the server; ``tls``: (certificate, key) for the TLS
        listeners next to the plain ones (``self.tls_port``, ``self.mqtt_tls_port``)."""
        super().__init__()
        self.command = command
        self.extra_args = extra_args or []
        self.mqtt = mqtt
        self.mqtt_port = 0
        self.amqp = amqp
        self.amqp_port = 0
        self.env = env or {}
        self.tls = tls
        self.tls_port = 0
        self.mqtt_tls_port = 0
        self.ws = ws
        self.mqtt_ws_port = 0

    @staticmethod
    def default_command() -> list[str]:
        for candidate in (REPO / ".venv/bin/vibemq-server", Path(sys.prefix) / "bin/vibemq-server"):
            if candidate.exists():
                return [str(candidate)]
        found = shutil.which("vibemq-server")
        if found:
            return [found]
        raise NotInstalled(
            "vibemq-server not found (run: .venv/bin/pip install -e . ) or pass --target"
        )

    def start(self, timeout: float = 30.0) -> None:
        command = self.command or self.default_command()
        self.tmp = Path(tempfile.mkdtemp(prefix="bench-vibemq-"))
        ready = self.tmp / "ready.json"
        argv = [
            *command,
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--ready-file",
            str(ready),
            "--log-level",
            "warning",
            *self.extra_args,
        ]
        if self.mqtt:
            self.mqtt_port = free_port()
            argv += ["--mqtt-port", str(self.mqtt_port)]
        else:
            argv += ["--no-mqtt"]  # 1883 may be taken (a system mosquitto)
        if self.amqp:
            if "--amqp-port" not in help_text(tuple(command)):
                raise NotInstalled(f"{command[0]} has no --amqp-port (no AMQP listener yet)")
            self.amqp_port = free_port()
            argv += ["--amqp-port", str(self.amqp_port)]
        elif "--no-amqp" in help_text(tuple(command)):
            argv += ["--no-amqp"]  # 5672 may be taken (a system rabbitmq)
        if "--http-port" in help_text(tuple(command)):
            # the management listener, on any free port (2927 may be taken by another run);
            # extra_args may turn it off (--no-http) to compare
            argv += ["--http-port", "0", "--http-tls-port", "0"]
        if self.tls is not None:
            cert, key = self.tls
            argv += ["--tls-cert", str(cert), "--tls-key", str(key)]
            argv += ["--tls-port", "0", "--mqtt-tls-port", "0", "--amqp-tls-port", "0"]
        if self.ws:
            argv += ["--mqtt-ws-port", "0"]
        env = {**os.environ, **self.env}
        if self.command is None and "PYTHONPATH" not in self.env:
            # the broker runs this checkout's modules (a compiled copy in /tmp included), not
            # whatever the venv's editable install points at: its vibemq-server script would
            # otherwise import another tree, and the bench measure that one
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        self._spawn(argv, env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise self._died()
            try:
                info = json.loads(ready.read_text())
                self.port = int(info["vibemq"])
                if self.tls is not None:
                    self.tls_port = int(info["vibemq_tls"])
                    self.mqtt_tls_port = int(info.get("mqtt_tls") or 0)
                if self.ws:
                    self.mqtt_ws_port = int(info["mqtt_ws"])
            except (OSError, ValueError, KeyError, TypeError):
                time.sleep(0.05)
                continue
            if self.mqtt:
                self.mqtt_port = int(info.get("mqtt") or self.mqtt_port)
                if not wait_port(self.host, self.mqtt_port, max(1.0, deadline - time.monotonic())):
                    self.stop()
                    raise BenchError(f"vibemq-server: MQTT port {self.mqtt_port} not listening")
            if self.amqp:
                self.amqp_port = int(info.get("amqp") or self.amqp_port)
                if not wait_port(self.host, self.amqp_port, max(1.0, deadline - time.monotonic())):
                    self.stop()
                    raise BenchError(f"vibemq-server: AMQP port {self.amqp_port} not listening")
            return
        self.stop()
        raise BenchError(f"vibemq-server wrote no ready file within {timeout:.0f}s")


class MosquittoBroker(Broker):
    name = "mosquitto"

    def __init__(
        self, inflight: int = 1000, tls: tuple[Path, Path] | None = None, ws: bool = False
    ) -> None:
        """``tls``: (certificate, key) for a TLS listener next to the plain one
        (``self.tls_port``); ``ws``: a websockets listener too (``self.ws_port``)."""
        super().__init__()
        self.inflight = inflight
        self.tls = tls
        self.tls_port = 0
        self.ws = ws
        self.ws_port = 0

    def start(self, timeout: float = 20.0) -> None:
        exe = shutil.which("mosquitto") or (
            "/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None
        )
        if exe is None:
            raise NotInstalled("mosquitto is not installed (apt-get install -y mosquitto)")
        self.tmp = Path(tempfile.mkdtemp(prefix="bench-mosquitto-"))
        os.chmod(self.tmp, 0o755)
        self.port = free_port()
        conf = self.tmp / "mosquitto.conf"
        conf.write_text(
            f"listener {self.port} 127.0.0.1\n"
            "allow_anonymous true\n"
            "persistence false\n"
            # the QoS 1 window towards a subscriber, the equivalent of prefetch
            f"max_inflight_messages {self.inflight}\n"
            # do not drop QoS 1 messages queued behind the in-flight window
            "max_queued_messages 10000000\n"
            "log_dest stderr\n"
            "log_type error\n"
            "log_type warning\n"
        )
        if self.tls is not None:
            self.tls_port = free_port()
            cert, key = self.tls
            with conf.open("a") as fh:
                fh.write(
                    f"listener {self.tls_port} 127.0.0.1\n"
                    f"certfile {cert}\nkeyfile {key}\n"
                    "tls_version tlsv1.2\n"  # the minimum, as VibeMQ's default
                )
        if self.ws:
            self.ws_port = free_port()
            with conf.open("a") as fh:
                fh.write(f"listener {self.ws_port} 127.0.0.1\nprotocol websockets\n")
        os.chmod(conf, 0o644)
        self._spawn([exe, "-c", str(conf)])
        if (
            not wait_port(self.host, self.port, timeout)
            or (self.tls is not None and not wait_port(self.host, self.tls_port, timeout))
            or (self.ws and not wait_port(self.host, self.ws_port, timeout))
        ):
            self.stop()
            raise self._died()


class RabbitMQBroker(Broker):
    name = "rabbitmq"

    def start(self, timeout: float = 90.0) -> None:
        exe = next(
            (
                p
                for p in ("/usr/lib/rabbitmq/bin/rabbitmq-server", shutil.which("rabbitmq-server"))
                if p and Path(p).exists()
            ),
            None,
        )
        if exe is None:
            raise NotInstalled(
                "rabbitmq-server is not installed (apt-get install -y rabbitmq-server)"
            )
        self.tmp = Path(tempfile.mkdtemp(prefix="bench-rabbitmq-"))
        self.port = free_port()
        dist_port = free_port()
        plugins = self.tmp / "enabled_plugins"
        plugins.write_text("[].\n")
        env = dict(os.environ)
        env.update(
            HOME=str(self.tmp),  # the Erlang cookie goes here
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_DIST_PORT=str(dist_port),
            RABBITMQ_NODENAME=f"bench{os.getpid()}@localhost",
            RABBITMQ_MNESIA_BASE=str(self.tmp / "mnesia"),
            RABBITMQ_LOG_BASE=str(self.tmp / "log"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(plugins),
            RABBITMQ_CONFIG_FILE=str(self.tmp / "rabbitmq"),  # none: defaults
        )
        self._spawn([exe], env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise self._died()
            if wait_port(self.host, self.port, 0.5):
                return
            time.sleep(0.2)
        self.stop()
        raise BenchError(f"rabbitmq did not listen within {timeout:.0f}s:\n{self.log_tail()}")


def check_alive(broker: Broker | None) -> None:
    """Stop measuring a broker we started once it has exited."""
    if broker is not None and broker.proc is not None and broker.proc.poll() is not None:
        raise BenchError(
            f"{broker.name} exited with code {broker.proc.returncode}; log tail:\n"
            + broker.log_tail()
        )
