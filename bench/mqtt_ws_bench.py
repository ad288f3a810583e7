"""MQTT over WebSockets, QoS 0, 1 publisher -> 1 subscriber: VibeMQ's ``--mqtt-ws-port``
against Mosquitto's ``protocol websockets`` listener, both started by the bench, in one run,
alternating rounds (the order flips every round), 64-byte payloads, MQTT 3.1.1.

The load generator is what a browser client does on the wire: each PUBLISH is one masked
binary WebSocket frame (as mqtt.js and paho send them), pre-encoded once with the
``websockets`` library's ``Frame.serialize`` (a random mask per frame) and written
``--batch`` frames at a time; the subscriber takes the server's (unmasked) frames apart in a
small loop of its own and counts the deliveries with ``mqtt_bench.DeliveryScanner``.
Publisher and subscriber run in separate ``spawn`` processes. The opening handshake is the
``websockets`` library's ``ClientProtocol``.

    .venv/bin/python -m bench.mqtt_ws_bench
    .venv/bin/python -m bench.mqtt_ws_bench --rounds 5 --messages 300000 --json ws.json
    .venv/bin/python -m bench.mqtt_ws_bench --layer    # the WebSocket layer alone
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

from bench.brokers import Broker, MosquittoBroker, NotInstalled, VibeMQBroker
from bench.common import (
    BenchError,
    BlockingConn,
    cpu_seconds,
    expect_report,
    install_sigterm_exit,
    raise_nofile_limit,
)
from bench.mqtt_bench import DeliveryScanner, Layout
from bench.mqtt_driver import CONNACK, SUBACK, U16, packet, read_packet

RECV_SIZE = 1 << 18


def client_frame(data: bytes) -> bytes:
    """One masked binary frame (a client's), by the library."""
    return Frame(Opcode.BINARY, data).serialize(mask=True, extensions=[])


class WsConn(BlockingConn):
    """A blocking MQTT-over-WebSocket client connection: ``send`` writes one binary frame,
    ``send_raw`` bytes already framed; ``recv`` returns the payload of the server's frames
    (answering pings, b"" on a close frame or EOF)."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        proto = ClientProtocol(
            parse_uri(f"ws://{host}:{port}/mqtt"), subprotocols=[Subprotocol("mqtt")]
        )
        proto.send_request(proto.connect())
        self.sock.sendall(b"".join(proto.data_to_send()))
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise BenchError("closed during the WebSocket handshake")
            head += chunk
        end = head.index(b"\r\n\r\n") + 4
        proto.receive_data(head[:end])
        events = proto.events_received()
        if not events or not isinstance(events[0], Response) or events[0].status_code != 101:
            raise BenchError(f"WebSocket handshake refused: {head[:end]!r}")
        self.frames = bytearray(head[end:])  # what came after the response: frames

    def send(self, data: bytes | memoryview) -> None:
        self.sock.sendall(client_frame(bytes(data)))

    def send_raw(self, data: bytes | memoryview) -> None:
        self.sock.sendall(data)

    def recv(self, size: int = RECV_SIZE) -> bytes:
        while True:
            payload, closed = self._deframe()
            if payload or closed:
                return payload
            chunk = self.sock.recv(size)
            if not chunk:
                return b""
            self.frames += chunk

    def _deframe(self) -> tuple[bytes, bool]:
        """The payload of every complete frame buffered; whether a close frame came."""
        buf = self.frames
        out: list[bytes] = []
        pos, end = 0, len(buf)
        closed = False
        while end - pos >= 2:
            opcode, length = buf[pos] & 0x0F, buf[pos + 1] & 0x7F
            start = pos + 2
            if length == 126:
                if end - pos < 4:
                    break
                length, start = U16.unpack_from(buf, pos + 2)[0], pos + 4
            elif length == 127:
                if end - pos < 10:
                    break
                length, start = int.from_bytes(buf[pos + 2 : pos + 10], "big"), pos + 10
            if end - start < length:
                break
            if opcode in (0x0, 0x2):
                out.append(bytes(buf[start : start + length]))
            elif opcode == 0x9:  # ping: pong
                self.sock.sendall(
                    Frame(Opcode.PONG, bytes(buf[start : start + length])).serialize(
                        mask=True, extensions=[]
                    )
                )
            elif opcode == 0x8:
                closed = True
            pos = start + length
        del buf[:pos]
        return b"".join(out), closed


class TcpConn(BlockingConn):
    """The same client on plain MQTT (the reference each broker's WebSocket path is compared
    with)."""

    def send_raw(self, data: bytes | memoryview) -> None:
        self.sock.sendall(data)


def mqtt_connect(host: str, port: int, role: str, timeout: float, ws: bool) -> WsConn | TcpConn:
    conn = WsConn(host, port, timeout) if ws else TcpConn(host, port, timeout)
    client_id = f"wsb-{role}-{os.getpid()}-{uuid.uuid4().hex[:8]}".encode()
    conn.send(
        packet(
            0x10,
            U16.pack(4)
            + b"MQTT"
            + bytes((4, 0x02))
            + U16.pack(600)
            + U16.pack(len(client_id))
            + client_id,
        )
    )
    first, rest = read_packet(conn)
    if first != CONNACK or rest[1:2] != b"\x00":
        raise BenchError(f"CONNACK refused: {first:#x} {rest.hex()}")
    return conn


@dataclass
class Side:
    """What a worker reports."""

    sent: int = 0
    delivered: int = 0
    t_start_ns: int = 0
    t_first_ns: int = 0
    t_last_ns: int = 0
    cpu_s: float = 0.0
    error: str = ""


def publisher_main(
    host: str, port: int, ws: bool, layout: Layout, total: int, batch: int, pipe: Connection
) -> None:
    st = Side()
    try:
        one = layout.encode(0, b"x" * layout.payload_size)
        frames = [client_frame(one) if ws else one for _ in range(batch)]
        size = len(frames[0])
        chunk = b"".join(frames)
        conn = mqtt_connect(host, port, "pub", 30.0, ws)
        pipe.send(("ready", None))
        if not pipe.poll(60) or pipe.recv()[0] != "go":
            raise BenchError("no go")
        cpu0 = time.process_time()
        st.t_start_ns = time.monotonic_ns()
        for start in range(0, total, batch):
            n = min(batch, total - start)
            conn.send_raw(chunk if n == batch else chunk[: n * size])
            st.sent += n
        st.t_last_ns = time.monotonic_ns()
        st.cpu_s = time.process_time() - cpu0
        with contextlib.suppress(OSError):
            conn.send(b"\xe0\x00")
        conn.close()
    except (BenchError, OSError) as exc:
        st.error = f"publisher: {exc}"
    pipe.send(("done", asdict(st)))


def subscriber_main(
    host: str,
    port: int,
    ws: bool,
    layout: Layout,
    expected: int,
    drain_s: float,
    pipe: Connection,
) -> None:
    st = Side()
    try:
        conn = mqtt_connect(host, port, "sub", 30.0, ws)
        topic = layout.topic
        conn.send(packet(0x82, U16.pack(1) + U16.pack(len(topic)) + topic + b"\x00"))
        first, rest = read_packet(conn)
        if first != SUBACK or rest[-1:] != b"\x00":
            raise BenchError(f"SUBACK refused: {rest.hex()}")
        scanner = DeliveryScanner(layout)
        if conn.buf:
            scanner.feed(bytes(conn.buf))
        pipe.send(("ready", None))
        if not pipe.poll(60) or pipe.recv()[0] != "go":
            raise BenchError("no go")
        cpu0 = time.process_time()
        conn.sock.settimeout(0.25)
        pub_done = 0.0
        last = time.monotonic()
        deadline = last + 300
        while scanner.delivered < expected:
            now = time.monotonic()
            if pipe.poll():
                pipe.recv()
                pub_done = pub_done or now
            if pub_done and now - max(last, pub_done) > drain_s:
                break  # QoS 0: what has not come by now is lost
            if now > deadline or now - last > 30:
                raise BenchError(f"stalled at {scanner.delivered}/{expected}")
            try:
                data = conn.recv()
            except TimeoutError:
                continue
            if not data:
                raise BenchError("the broker closed the subscriber")
            scanner.feed(data)
            st.t_last_ns = time.monotonic_ns()
            st.t_first_ns = st.t_first_ns or st.t_last_ns
            last = time.monotonic()
        st.cpu_s = time.process_time() - cpu0
        st.delivered = scanner.delivered
        with contextlib.suppress(OSError):
            conn.send(b"\xe0\x00")
        conn.close()
    except (BenchError, OSError) as exc:
        st.error = f"subscriber: {exc}"
    pipe.send(("done", asdict(st)))


@dataclass
class Run:
    broker: str
    transport: str
    round: int
    messages: int
    delivered: int = 0
    loss_pct: float = 0.0
    deliveries_per_s: float = 0.0
    broker_cpu_s: float = 0.0
    #: broker CPU per delivery, µs
    cpu_us: float = 0.0
    errors: list[str] = field(default_factory=list)


def run_once(
    name: str, broker: Broker, port: int, ws: bool, rnd: int, args: argparse.Namespace
) -> Run:
    ctx = mp.get_context("spawn")
    layout = Layout(f"wsbench/{uuid.uuid4().hex[:10]}".encode(), 0)
    run = Run(name, "ws" if ws else "tcp", rnd, args.messages)
    sub_pipe, sub_child = ctx.Pipe()
    pub_pipe, pub_child = ctx.Pipe()
    host = broker.host
    sub = ctx.Process(
        target=subscriber_main,
        args=(host, port, ws, layout, args.messages, args.drain, sub_child),
        daemon=True,
    )
    pub = ctx.Process(
        target=publisher_main,
        args=(host, port, ws, layout, args.messages, args.batch, pub_child),
        daemon=True,
    )
    try:
        sub.start()
        pub.start()
        expect_report(sub_pipe, "ready", 60)
        expect_report(pub_pipe, "ready", 60)
        cpu0 = cpu_seconds(broker.pids())
        sub_pipe.send(("go", None))
        pub_pipe.send(("go", None))
        pub_st = Side(**expect_report(pub_pipe, "done", 330))
        sub_pipe.send(("pub_done", None))
        sub_st = Side(**expect_report(sub_pipe, "done", 330))
        run.broker_cpu_s = round(cpu_seconds(broker.pids()) - cpu0, 2)
        if sub_st.delivered:
            run.cpu_us = round(run.broker_cpu_s / sub_st.delivered * 1e6, 2)
        run.errors += [e for e in (pub_st.error, sub_st.error) if e]
        run.delivered = sub_st.delivered
        run.loss_pct = round(100.0 * (args.messages - sub_st.delivered) / args.messages, 2)
        if sub_st.t_last_ns > pub_st.t_start_ns > 0:
            run.deliveries_per_s = round(
                sub_st.delivered / ((sub_st.t_last_ns - pub_st.t_start_ns) / 1e9)
            )
    except BenchError as exc:
        run.errors.append(str(exc))
    finally:
        for proc in (pub, sub):
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
    return run


# --------------------------------------------------------------------------------------------
# the layer alone (--layer): µs per frame through the library's ServerProtocol and through
# vibemq_server.server.websocket (its short paths), in the same process, alternating rounds


class _NullLink:
    """Just enough of a ``Link`` for the layer; output is dropped."""

    conn_id = "bench"
    peer_host = "127.0.0.1"
    peer_identity: str | None = None
    over_tls = False
    writable = True
    reading_paused = False

    def __init__(self) -> None:
        import structlog

        self.log = structlog.get_logger("bench")

    def send(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def call_soon(self, callback: Any) -> None:
        callback()

    def call_later(self, delay: float, callback: Any) -> None:
        pass

    def offload(self, work: Any, then: Any) -> None:
        then(work())

    def time(self) -> float:
        return 0.0


class _NullSession:
    def __init__(self, link: Any) -> None:
        self.link = link

    def data_received(self, data: bytes) -> None:
        pass

    def writable_again(self) -> None:
        pass

    def connection_lost(self, exc: Exception | None) -> None:
        pass

    def check_timers(self, now: float, keepalive: float, frame_timeout: float) -> None:
        pass

    def shutdown(self, reason: str) -> None:
        pass

    def describe(self) -> Any:
        return None

    def close_by_operator(self, reason: str) -> None:
        pass


_REQUEST = (
    b"GET /mqtt HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
    b"Sec-WebSocket-Protocol: mqtt\r\n\r\n"
)


def layer_rounds(rounds: int, frames: int = 100, reads: int = 500) -> dict[str, float]:
    """Median µs per frame in and per message out, library vs our layer; in, ours also with
    its pure unmasking loop in place of the C routine (``ours_in_pure``)."""
    from websockets.server import ServerProtocol

    from vibemq_server.server import websocket
    from vibemq_server.server.websocket import Endpoint, WebSocketSession

    publish = Layout(b"wsbench/abcdefghij", 0).encode(0, b"x" * 64)
    chunk = b"".join(client_frame(publish) for _ in range(frames))
    keys = ("lib_in", "ours_in", "ours_in_pure", "lib_out", "ours_out")
    results: dict[str, list[float]] = {k: [] for k in keys}
    unmask_run = websocket.unmask_run
    for _ in range(rounds):
        lib = ServerProtocol(subprotocols=[Subprotocol("mqtt")], max_size=1 << 20)
        lib.receive_data(_REQUEST)
        lib.send_response(lib.accept(lib.events_received()[0]))  # type: ignore[arg-type]
        lib.data_to_send()
        t = time.perf_counter()
        for _ in range(reads):
            lib.receive_data(chunk)
            for event in lib.events_received():
                _ = event.data  # type: ignore[union-attr]
        results["lib_in"].append((time.perf_counter() - t) / (reads * frames) * 1e6)
        t = time.perf_counter()
        for _ in range(reads * frames):
            lib.send_binary(publish)
            lib.data_to_send()
        results["lib_out"].append((time.perf_counter() - t) / (reads * frames) * 1e6)
        endpoint = Endpoint("/mqtt", ("mqtt",), 1 << 20, 10.0, "mqtt")
        for key, run in (("ours_in", unmask_run), ("ours_in_pure", websocket.unmask_run_pure)):
            websocket.unmask_run = run
            try:
                ours = WebSocketSession(_NullLink(), _NullSession, endpoint)
                ours.data_received(_REQUEST)
                t = time.perf_counter()
                for _ in range(reads):
                    ours.data_received(chunk)
                results[key].append((time.perf_counter() - t) / (reads * frames) * 1e6)
            finally:
                websocket.unmask_run = unmask_run
        t = time.perf_counter()
        for _ in range(reads * frames):
            ours.send(publish)
        results["ours_out"].append((time.perf_counter() - t) / (reads * frames) * 1e6)
    return {k: round(statistics.median(v), 2) for k, v in results.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="each round measures both brokers")
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--batch", type=int, default=100, help="frames per write of the publisher")
    p.add_argument("--drain", type=float, default=1.0, help="s without deliveries = done")
    p.add_argument(
        "--no-tcp", action="store_true", help="WebSockets only (no plain-MQTT reference)"
    )
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument(
        "--layer",
        action="store_true",
        help="only the WebSocket layer in this process: library vs ours, µs per frame",
    )
    args = p.parse_args(argv)
    if args.layer:
        layer = layer_rounds(max(args.rounds, 5))
        print(
            f"µs per frame in: library {layer['lib_in']}, ours {layer['ours_in']} "
            f"(with the pure unmasking loop {layer['ours_in_pure']}); "
            f"per message out: library {layer['lib_out']}, ours {layer['ours_out']}"
        )
        if args.json is not None:
            args.json.write_text(json.dumps(layer, indent=2))
        return 0
    install_sigterm_exit()
    raise_nofile_limit()
    env = {"VIBEMQ_MQTT__MAX_QUEUED_MESSAGES": "10000000"}
    mosquitto = MosquittoBroker(ws=True)
    vibemq = VibeMQBroker(mqtt=True, ws=True, env=env)
    transports = (True,) if args.no_tcp else (True, False)
    runs: list[Run] = []
    try:
        mosquitto.start()
        vibemq.start()
        ports = {
            ("mosquitto", True): (mosquitto, mosquitto.ws_port),
            ("mosquitto", False): (mosquitto, mosquitto.port),
            ("vibemq", True): (vibemq, vibemq.mqtt_ws_port),
            ("vibemq", False): (vibemq, vibemq.mqtt_port),
        }
        for rnd in range(1, args.rounds + 1):
            order = ["mosquitto", "vibemq"] if rnd % 2 else ["vibemq", "mosquitto"]
            for ws in transports:
                for name in order:
                    broker, port = ports[name, ws]
                    run = run_once(name, broker, port, ws, rnd, args)
                    runs.append(run)
                    print(
                        f"round {rnd} {run.transport:3s} {name:9s} "
                        f"{run.deliveries_per_s:>9,} deliveries/s loss {run.loss_pct:.2f}% "
                        f"broker {run.cpu_us:.2f} µs CPU/delivery"
                        + (f"  ERRORS: {'; '.join(run.errors)}" if run.errors else ""),
                        flush=True,
                    )
    except NotInstalled as exc:
        print(f"SKIPPED: {exc}")
        return 1
    finally:
        vibemq.stop()
        mosquitto.stop()
    summary = summarize(runs)
    for transport, row in summary.items():
        print(
            f"{transport}: median deliveries/s mosquitto {row['mosquitto']:,.0f}, vibemq "
            f"{row['vibemq']:,.0f}, ratio {row['ratio']:.2f} (per round {row['per_round']}); "
            f"CPU µs/delivery mosquitto {row['mosquitto_cpu_us']}, vibemq {row['vibemq_cpu_us']}"
        )
    if args.json is not None:
        out = {"runs": [asdict(r) for r in runs], "summary": summary, "args": vars(args)}
        args.json.write_text(json.dumps(out, indent=2, default=str))
    return 1 if any(r.errors for r in runs) else 0


def summarize(runs: list[Run]) -> dict[str, dict[str, Any]]:
    """Per transport: median deliveries/s and CPU per delivery of each broker, the ratio
    of the medians, and each round's own ratio (both brokers measured back to back)."""
    out: dict[str, dict[str, Any]] = {}
    for transport in sorted({r.transport for r in runs}, reverse=True):
        mine = [r for r in runs if r.transport == transport and not r.errors]
        row: dict[str, Any] = {}
        for name in ("mosquitto", "vibemq"):
            rate = [r.deliveries_per_s for r in mine if r.broker == name]
            cpu = [r.cpu_us for r in mine if r.broker == name]
            row[name] = statistics.median(rate) if rate else 0.0
            row[f"{name}_cpu_us"] = round(statistics.median(cpu), 2) if cpu else None
        row["ratio"] = round(row["vibemq"] / row["mosquitto"], 2) if row["mosquitto"] else 0.0
        by_round = {(r.broker, r.round): r.deliveries_per_s for r in mine}
        row["per_round"] = [
            round(by_round["vibemq", n] / by_round["mosquitto", n], 2)
            for n in sorted({r.round for r in mine})
            if by_round.get(("mosquitto", n)) and ("vibemq", n) in by_round
        ]
        out[transport] = row
    return out


if __name__ == "__main__":
    raise SystemExit(main())
