"""The ZeroMQ bridge: a PULL socket into the broker, a PUB socket out of it (docs/zmq.md).

ZMTP is libzmq's (through pyzmq); this module only turns ZeroMQ events into core commands
and the core's hand-over of publishes into sends:

* **PULL** -- a multipart message ``[address, part1, ..., partN]`` is one publish at
  ``address``: its payload is the RFC 50/MME encoding of the parts (base64, with
  ``contentType: application/x-zmq-mme``, ``protocol/payload.py``). Like an MQTT publish it is
  handed to the core once (``manager.route``): into the VibeMQ queue named ``address`` when
  that queue exists (a ZeroMQ address nobody reads must not pile up messages), and to every
  protocol's subscriptions of the address, ours included.
* **PUB** (an XPUB underneath, so we learn the SUB peers' prefixes) -- this bridge is the
  ZeroMQ sink of the core's routing (``deliver``): every publish at an address some SUB prefix
  matches, from any protocol, is sent as ``[address, part1, ..., partN]``: the parts of an MME
  body, or the original bytes as the one part. A malformed MME body from another protocol goes
  out as one part, with a (throttled) log line. SUB peers read as ``zmq.user``: an address
  that user may not read goes to no peer.

Both sockets are plain (blocking-API) pyzmq sockets driven by the event loop through their
``ZMQ_FD``: no task per message, no thread. That descriptor is edge-triggered (it signals
that the socket's state changed, not that a message is there), so each wake-up drains the
socket until ``EAGAIN``, at most ``zmq.batch`` messages per loop turn; when it stops early
it reschedules itself, since no new edge would come for what is already queued.

Bounds: the PULL socket queues ``rcvhwm`` messages, beyond which PUSH peers block (ZeroMQ's
own back-pressure), and the bridge stops reading while the core is over its memory high
watermark. Each SUB peer gets at most ``sndhwm`` queued messages; beyond that a PUB socket
drops (ZeroMQ semantics), so a slow SUB never makes the broker buffer without limit.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from typing import Any

import structlog
import zmq

from vibemq_server.auth import ANONYMOUS
from vibemq_server.core import CoreError, StoredMessage
from vibemq_server.core.permissions import Operation
from vibemq_server.core.routing import AddressSink, MessageSource
from vibemq_server.protocol import mme
from vibemq_server.protocol.mme import MmeError
from vibemq_server.protocol.payload import (
    MULTIPART_RAW_HEADERS,
    from_core,
    multipart_from_core,
)
from vibemq_server.server.adapter import AdapterContext

WRITE = Operation.WRITE
READ = Operation.READ
log = structlog.get_logger("vibemq.zmq")

#: An address is a non-empty UTF-8 string of at most this many octets (MQTT's topic limit).
MAX_ADDRESS = 65_535
_CACHE_MAX = 10_000
_LOG_INTERVAL_S = 10.0
_SUBSCRIBE = 1
_UNSUBSCRIBE = 0
_NOT_CACHED = b"\x00not cached"

# pyzmq's Python-level ``send``/``send_multipart``/``recv_multipart`` spend several
# microseconds per call on argument checks and enum flag arithmetic, more than libzmq itself
# (about 11 us against 2-3 us for a 4-frame send, measured for docs/zmq.md). The hot paths
# call the Cython methods underneath with plain int flags.
_send = zmq.backend.Socket.send
_recv = zmq.backend.Socket.recv
_get = zmq.backend.Socket.get
_NOBLOCK = int(zmq.NOBLOCK)
_MORE = int(zmq.SNDMORE) | _NOBLOCK
_RCVMORE = int(zmq.RCVMORE)


class _Throttled:
    """One warning per event per ``_LOG_INTERVAL_S``: a peer that keeps sending bad
    messages must not turn into a log line per message."""

    def __init__(self) -> None:
        self._next: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, event: str, **fields: Any) -> None:
        now = time.monotonic()
        if now < self._next.get(event, 0.0):
            self._suppressed[event] = self._suppressed.get(event, 0) + 1
            return
        self._next[event] = now + _LOG_INTERVAL_S
        suppressed = self._suppressed.pop(event, 0)
        log.warning(event, suppressed_since_last=suppressed, **fields)


class ZmqBridge(AddressSink):
    """``await start()`` binds the configured sockets (then ``pull_endpoint`` /
    ``pub_endpoint`` are the bound endpoints); ``close()`` unbinds them."""

    def __init__(self, context: AdapterContext) -> None:
        self.cfg = context.config.zmq
        self.max_message_size = context.config.max_message_size
        self.manager = context.manager
        #: PULL has no login: its publishes are those of the configured user (write checks)
        self.access = context.auth.access(self.cfg.user or ANONYMOUS)
        #: deliveries a PULL batch gives other connections are written when the batch is done
        self.batch = context.read_batch
        self.ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self.pull: zmq.Socket[bytes] | None = None
        self.pub: zmq.Socket[bytes] | None = None
        self.pull_endpoint: str | None = None
        self.pub_endpoint: str | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._fds: list[int] = []
        self._paused = False
        self._ids = itertools.count(1)
        self._id_prefix = f"zmq-{os.urandom(4).hex()}-"
        self._addresses: dict[bytes, str] = {}
        # SUB peers' prefixes (an XPUB reports each prefix's first subscribe and last
        # unsubscribe), and per address whether one matches: the address's bytes, or None.
        self._prefixes: set[bytes] = set()
        self._targets: dict[str, bytes | None] = {}
        self._subscriptions_check = False
        # The publish being routed from PULL (address, core payload, frames as they came):
        # its delivery to SUB peers reuses the frames; its core form is built only when
        # something else takes it (a queue, another protocol).
        self._own: tuple[str, bytes, list[bytes]] | None = None
        self._own_msg: StoredMessage | None = None
        self._own_message: MessageSource = self._core_message
        self._warn = _Throttled()
        #: messages from PULL, to PUB, and dropped (the metrics' protocol "zmq"; libzmq owns
        #: the peers' connections and bytes, so those are not counted here)
        self.stats = context.stats.protocol("zmq")

    # -- start / stop ----------------------------------------------------------------------------

    async def start(self) -> None:
        loop = self.loop = asyncio.get_running_loop()
        cfg = self.cfg
        ctx = self.ctx = zmq.Context(io_threads=1)
        try:
            if cfg.pull is not None:
                pull = self.pull = ctx.socket(zmq.PULL)
                pull.setsockopt(zmq.LINGER, 0)
                pull.setsockopt(zmq.RCVHWM, cfg.rcvhwm)
                # libzmq drops a peer sending a bigger frame before buffering it.
                pull.setsockopt(zmq.MAXMSGSIZE, self.max_message_size)
                pull.bind(cfg.pull)
                self.pull_endpoint = pull.getsockopt_string(zmq.LAST_ENDPOINT)
                self._watch(pull, self._on_pull)
            if cfg.pub is not None:
                pub = self.pub = ctx.socket(zmq.XPUB)
                pub.setsockopt(zmq.LINGER, 0)
                pub.setsockopt(zmq.SNDHWM, cfg.sndhwm)
                pub.bind(cfg.pub)
                self.pub_endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
                self._watch(pub, self._on_subscriptions)
                self.manager.register_sink(self)
        except zmq.ZMQError as exc:
            self.close()
            raise OSError(f"ZeroMQ bind failed: {exc}") from exc
        # Edge-triggered: whatever arrived before the reader was added would wait forever.
        loop.call_soon(self._on_pull)
        log.info("listening", protocol="zmq", pull=self.pull_endpoint, pub=self.pub_endpoint)

    def restore(self) -> None:
        pass  # the bridge keeps no durable state of its own

    def tick(self) -> None:
        pass

    def ready(self) -> dict[str, int | str | None]:
        return {"zmq_pull": self.pull_endpoint, "zmq_pub": self.pub_endpoint}

    def _watch(self, sock: zmq.Socket[bytes], callback: Any) -> None:
        assert self.loop is not None
        fd = sock.getsockopt(zmq.FD)
        assert isinstance(fd, int)
        self.loop.add_reader(fd, callback)
        self._fds.append(fd)

    def close(self) -> None:
        if self.loop is not None:
            for fd in self._fds:
                self.loop.remove_reader(fd)
        self._fds = []
        self.manager.unregister_sink(self)
        for sock in (self.pull, self.pub):
            if sock is not None:
                sock.close(linger=0)
        self.pull = self.pub = None
        if self.ctx is not None:
            self.ctx.term()
            self.ctx = None

    # -- PULL: ZeroMQ -> the core ------------------------------------------------------------------

    def _on_pull(self) -> None:
        sock = self.pull
        if sock is None or self._paused:
            return
        recv = _recv
        more = _get
        publish = self._publish
        batch = self.batch
        batch.begin()
        try:
            for _ in range(self.cfg.batch):
                try:
                    frames = [recv(sock, _NOBLOCK)]
                except zmq.Again:
                    break
                # The parts of a multipart message arrive together: the rest is there.
                while more(sock, _RCVMORE):
                    frames.append(recv(sock, _NOBLOCK))
                publish(frames)
            else:
                # More may be queued and no new edge will say so: go on next turn, after
                # the other connections had theirs.
                assert self.loop is not None
                self.loop.call_soon(self._on_pull)
        finally:
            batch.end()
        if self.manager.memory_blocked and not self._paused:
            self._paused = True
            log.info("zmq pull paused: memory high watermark")
            self.manager.wait_for_memory(self._resume)

    def _resume(self) -> None:
        self._paused = False
        if self.loop is not None:
            self.loop.call_soon(self._on_pull)

    def _address(self, raw: bytes) -> str:
        """The address a first frame names, or "" when it names none."""
        address = self._addresses.get(raw)
        if address is not None:
            return address
        try:
            address = raw.decode()
        except UnicodeDecodeError:
            address = ""
        if len(raw) > MAX_ADDRESS or "\x00" in address:
            address = ""
        if len(self._addresses) >= _CACHE_MAX:
            self._addresses.clear()
        self._addresses[raw] = address
        return address

    def _publish(self, frames: list[bytes]) -> None:
        stats = self.stats
        stats.messages_received += 1
        address = self._address(frames[0])
        if not address:
            stats.messages_dropped += 1
            self._warn.warning(
                "zmq message dropped: the first frame is not an address", frame=frames[0][:64]
            )
            return
        if not self.access.allowed(WRITE, address):
            stats.messages_dropped += 1
            self._warn.warning(
                "zmq message dropped: no write permission", address=address, user=self.access.user
            )
            return
        parts = frames[1:]
        body = mme.encode(parts)  # no MmeError: MAXMSGSIZE bounds each part
        if len(body) > self.max_message_size:
            stats.messages_dropped += 1
            self._warn.warning(
                "zmq message dropped: over max_message_size",
                address=address,
                size=len(body),
                limit=self.max_message_size,
            )
            return
        self._own = (address, body, frames)  # the MME body as it is (no base64)
        self._own_msg = None
        try:
            self.manager.route(address, self._own_message, self)
        except CoreError as exc:  # a subscriber's queue refusing it (storage failing)
            self.stats.messages_dropped += 1
            self._warn.warning("zmq publish failed", address=address, error=str(exc))
        finally:
            self._own = self._own_msg = None

    def _core_message(self) -> StoredMessage:
        """The core form of the publish _publish() is routing."""
        msg = self._own_msg
        if msg is None:
            assert self._own is not None
            address, payload, _ = self._own
            msg_id = f"{self._id_prefix}{next(self._ids)}"
            msg = self._own_msg = StoredMessage(msg_id, address, payload, MULTIPART_RAW_HEADERS, 0)
        return msg

    # -- PUB: the core -> ZeroMQ -------------------------------------------------------------------

    def deliver(self, address: str, message: MessageSource, origin: AddressSink | None) -> bool:
        """The core's hand-over of a publish at ``address`` on any protocol (the ZeroMQ
        sink): to the SUB peers whose prefix matches. Never journals anything (ZeroMQ
        delivery is at most once)."""
        if not self._prefixes:
            return False
        target = self._targets.get(address, _NOT_CACHED)
        if target is _NOT_CACHED:
            target = self._match(address)
        if target is None:
            return False
        pub = self.pub
        if pub is None:
            return False
        own = self._own
        if origin is self and own is not None:
            frames = own[2]
        else:
            frames = self._frames(address, target, message())
        try:
            # An XPUB over its high-water mark for a peer drops for that peer: never blocks.
            last = len(frames) - 1
            for i in range(last):
                _send(pub, frames[i], _MORE)
            _send(pub, frames[last], _NOBLOCK)
            self.stats.messages_sent += 1
        except zmq.ZMQError as exc:
            self._warn.warning("zmq send failed", address=address, error=str(exc))
        if not self._subscriptions_check:
            # Sending processes the socket's pending commands, which can spend the edge that
            # would have announced a (un)subscription: look once this turn is over.
            self._subscriptions_check = True
            assert self.loop is not None
            self.loop.call_soon(self._on_subscriptions)
        return False

    def _frames(self, address: str, target: bytes, msg: StoredMessage) -> list[bytes]:
        headers = msg.headers
        if not headers:
            return [target, msg.payload]
        try:
            return [target, *multipart_from_core(msg.payload, headers)]
        except MmeError as exc:
            self._warn.warning(
                "malformed multipart body sent as one part", address=address, error=str(exc)
            )
            return [target, from_core(msg.payload, headers)]

    def _match(self, address: str) -> bytes | None:
        raw = address.encode()
        # SUB peers have no login either: they read as ``zmq.user``, so an address that user
        # may not read goes to no SUB peer (decided once per address, cached below).
        matched = any(raw.startswith(p) for p in self._prefixes)
        target = raw if matched and self.access.allowed(READ, address) else None
        if len(self._targets) >= _CACHE_MAX:
            self._targets.clear()
        self._targets[address] = target
        return target

    def _on_subscriptions(self) -> None:
        """Drain the XPUB's subscription messages: ``\\x01prefix`` or ``\\x00prefix``."""
        self._subscriptions_check = False
        pub = self.pub
        if pub is None:
            return
        changed = False
        while True:
            try:
                event = pub.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            if not event or event[0] not in (_SUBSCRIBE, _UNSUBSCRIBE):
                continue  # a SUB peer sent a message, not a subscription: ignore it
            changed = True
            if event[0] == _SUBSCRIBE:
                self._prefixes.add(event[1:])
            else:
                self._prefixes.discard(event[1:])
        if changed:
            self._targets.clear()
            log.debug("zmq subscriptions changed", prefixes=len(self._prefixes))
