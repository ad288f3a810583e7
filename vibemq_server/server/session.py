"""The native VibeMQ protocol session of one connection: framing, state machine, handlers.

Sans-IO: the shared transport (``transport.StreamTransport``) hands it bytes through
``data_received`` and drives its timers; every complete frame of a read is parsed in one pass,
and the state table below says which command is allowed in which state and which handler runs
it. Replies and deliveries go out through the ``Link``; the session touches no socket and
reads no clock but the link's.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any, Final, cast

from vibemq_server import __version__
from vibemq_server.auth import Authenticator
from vibemq_server.auth.authenticator import Outcome, Verdict
from vibemq_server.config import Config
from vibemq_server.core import (
    Consumer,
    CoreError,
    InvalidQueueOptions,
    PersistenceUnavailable,
    PublishOutcome,
    Queue,
    QueueExists,
    QueueManager,
    QueueNotFound,
    StoredMessage,
    Subscription,
)
from vibemq_server.core.durable_replies import DurableReplies
from vibemq_server.core.permissions import BEFORE_LOGIN, Operation
from vibemq_server.protocol import (
    CommandType,
    ErrorCode,
    FrameDecoder,
    Limits,
    Message,
    ProtocolError,
    decode_body,
    encode,
    validate_json,
)
from vibemq_server.protocol.bigcopy import BIG_FROM as _BIG_FROM
from vibemq_server.protocol.bigcopy import FILL_FROM
from vibemq_server.protocol.bigcopy import join_range as _join_range
from vibemq_server.protocol.codec import (
    LARGE_PAYLOAD,
    BigFrame,
    Body,
    Split,
    deliver_parts,
    encode_deliver,
    encode_deliver_named,
    encode_publish_ack,
    encode_publish_acks,
    peek_ack_target,
    queue_piece,
)
from vibemq_server.protocol.jsoncheck import COMPILED as _JSON_COMPILED
from vibemq_server.protocol.jsoncheck import OFFLOAD_FROM as _JSON_OFFLOAD_FROM
from vibemq_server.protocol.jsoncheck import valid as _valid_json
from vibemq_server.protocol.names import valid_queue_name
from vibemq_server.protocol.payload import PAYLOAD_ENCODING, RAW, as_vibemq
from vibemq_server.server.stall import StallClock
from vibemq_server.server.stats import ProtocolStats
from vibemq_server.server.transport import ConsumerInfo, Link, LinkState, SessionInfo

# (Final: the compiled build reads these as constants, not from the module's dict per use)
_LOUD_ERRORS: Final = 10
_ACK_TYPE: Final = bytes([CommandType.ACK])
# Imported names a message reads, compiled: a name the compiled module it comes from declares
# Final is a C static there (an int one is inlined), so it is used as imported (LARGE_PAYLOAD,
# the enums' members); a plain name, or any name of an interpreted module, is a lookup in the
# module's dict at each use, so it is copied into a Final here (checked in the generated C,
# docs/performance.md "Eleventh round, native path").
_JSON_OFF_LOOP: Final = _JSON_COMPILED


class State(Enum):
    AWAITING_CONNECT = "awaiting_connect"
    OPEN = "open"
    CLOSED = "closed"


# The JSON check of every payload: the C checker itself where it is built, not the interpreted
# wrapper choosing it (a generic call and a Python frame a publish, from the compiled build).
_checker: Callable[[bytes], bool]
try:
    from vibemq_server.protocol._jsoncheck import valid as _c_valid_json

    _checker = _c_valid_json
except ImportError:  # not built: the wrapper, with its fallback
    _checker = _valid_json
_json_valid: Final = _checker


# Hot paths compare against these: an Enum member looked up on its class costs ~10x a global.
_OPEN: Final = State.OPEN
_ERROR: Final = CommandType.ERROR
_PUBLISH: Final = CommandType.PUBLISH
_CLOSED: Final = State.CLOSED
_ACCEPTED: Final = PublishOutcome.ACCEPTED
_ACCEPTED_DURABLE: Final = PublishOutcome.ACCEPTED_DURABLE


# Which core error becomes which wire error code.
_CORE_ERRORS: dict[type[CoreError], ErrorCode] = {
    QueueNotFound: ErrorCode.QUEUE_NOT_FOUND,
    QueueExists: ErrorCode.QUEUE_EXISTS,
    InvalidQueueOptions: ErrorCode.INVALID_MESSAGE,
    PersistenceUnavailable: ErrorCode.SERVER_ERROR,
}

_SERVER_TO_CLIENT = frozenset(
    {
        CommandType.CONNECT_ACK,
        CommandType.PONG,
        CommandType.PUBLISH_ACK,
        CommandType.SUBSCRIBE_ACK,
        CommandType.UNSUBSCRIBE_ACK,
        CommandType.DELIVER,
    }
)

# CreateQueue options given as headers; any of these present means "options are in headers".
_OPTION_HEADERS = frozenset(
    {
        "deliveryMode",
        "mode",
        "maxQueueSize",
        "messageTtl",
        "enableDeadLetterQueue",
        "deadLetterQueueName",
        "maxRetryAttempts",
        "ackTimeout",
        "overflowStrategy",
    }
)


#: the deque of held-back publishes every session starts with, shared and never appended
#: to (a deque is 760 bytes even empty): a session makes its own at its first one
_NO_DEFERRED: deque[Message] = deque()


class Session(Consumer):
    """One client's protocol session: authentication, subscriptions, publisher flow control."""

    # (slotted: an idle connection costs only what it holds; compiled, it is anyway)
    __slots__ = (
        "_acked",
        "_after_auth",
        "_authenticating",
        "_batching",
        "_burst",
        "_deferred",
        "_durable",
        "_error_seq",
        "_errors_logged",
        "_handlers",
        "_holders",
        "_holders_limit",
        "_json_ok",
        "_last_rx",
        "_link_state",
        "_memory_paused",
        "_rate",
        "_refilled",
        "_send",
        "_stall",
        "_state",
        "_tokens",
        "access",
        "auth",
        "client_version",
        "config",
        "conn_id",
        "decoder",
        "limits",
        "link",
        "log",
        "manager",
        "stats",
        "subs",
        "user",
    )

    def __init__(
        self,
        link: Link,
        manager: QueueManager,
        config: Config,
        auth: Authenticator | None = None,
        stats: ProtocolStats | None = None,
    ) -> None:
        self.link = link
        # link.send bound once: the PublishAck and the Deliver of every message go through it
        # when the link has no LinkState (a Link is a protocol: each ``self.link.send`` looks
        # the method up generically)
        self._send = link.send
        # The transport's own output (``StreamTransport.link_state``): whether the connection
        # takes more, read natively each delivery, and its ``send``, called natively for each
        # PublishAck and Deliver; None for a link of another kind (WebSocket's, the tests'),
        # asked through its ``writable`` and sent to through ``_send``.
        state = getattr(link, "link_state", None)
        self._link_state = state if isinstance(state, LinkState) else None
        #: the native protocol's counters (messages in/out, errors), shared by its sessions
        self.stats = stats if stats is not None else ProtocolStats("vibemq")
        self.manager = manager
        self.config = config
        self.auth = auth if auth is not None else Authenticator(config)
        #: who the client logged in as, and what that user may do (set by Connect)
        self.user: str | None = None
        #: the clientVersion header of Connect (what the client says it is)
        self.client_version: str | None = None
        self.access = BEFORE_LOGIN
        self.conn_id = link.conn_id
        self.log = link.log
        self._state = State.AWAITING_CONNECT
        self._handlers = _HANDLERS[self._state]
        self.limits = Limits(config.max_message_size, config.max_headers, config.max_header_value)
        # (a frame of _BIG_FROM bytes or more comes as its reads: its payload is joined off
        # the loop, see _join_off_loop; one with a payload of LARGE_PAYLOAD or more comes
        # with its payload apart, copied once out of the reads: _handle_split)
        # (and one with FILL_FROM bytes or more of its payload still to come once its head
        # is in has the rest read straight into the payload: link.read_into)
        self.decoder = FrameDecoder(config.max_message_size, _BIG_FROM, LARGE_PAYLOAD, FILL_FROM)
        self._last_rx = link.time()
        # Since when a frame has been incomplete without progress (stall.py).
        self._stall = StallClock()
        self.subs: dict[str, Subscription] = {}
        # With more than one subscription: which one each delivery went to, by message id,
        # so that an Ack finds its subscription without asking every one in turn (a client
        # subscribed to 500 queues made each Ack cost 500 lookups). Only a hint: a miss or
        # a stale entry falls back to asking them in order; cleared when it outgrows what
        # the subscriptions can hold in flight (entries of deliveries that never got acked).
        self._holders: dict[str, Subscription] | None = None
        self._holders_limit = 1024
        # Publishes held back while a BlockPublisher queue is full, in arrival order.
        self._deferred: deque[Message] = _NO_DEFERRED  # (its own made at the first one)
        # Queues whose subscribers acks freed during a batch of frames, refilled after it.
        self._acked: dict[str, Queue] = {}
        self._batching = False
        # Publishes whose PublishAck waits for the journal (made with the first of them).
        self._durable: DurableReplies[Message] | None = None
        self._memory_paused = False
        self._rate = config.publish_rate_limit
        # The bucket holds at least one token, so a rate under 1/s still lets publishes through.
        self._burst = max(1.0, self._rate)
        self._tokens = self._burst
        self._refilled = link.time()
        self._error_seq = 0
        self._errors_logged = 0
        # While a Connect's password hash is verified off the loop: the frames of the read
        # that came after it, handled once the verdict is in (reading paused meanwhile).
        self._authenticating = False
        self._after_auth: list[Body] = []
        # The payload of the Split being run when the decoder checked it as its parts landed
        # and found it JSON (b"": none): on_publish does not check it again.
        self._json_ok = b""

    @property
    def state(self) -> State:
        return self._state

    @state.setter
    def state(self, state: State) -> None:
        self._state = state
        self._handlers = _HANDLERS[state]

    # -- input (the transport's Session interface) ---------------------------------------------

    def data_received(self, data: bytes) -> None:
        """Run every complete frame of ``data`` (with what was buffered); a framing error
        that cannot be resynchronised is answered, then the connection is closed."""
        decoder = self.decoder
        self._last_rx = now = self.link.time()
        try:
            # (the list is this call's own and only read: bytes and Split bodies, a Body list)
            bodies = cast(list[Body], decoder.feed_frames(data))
        except ProtocolError as exc:  # the stream is beyond repair; decoder.error says why
            bodies = []
            self.log.debug("framing error", error=str(exc))
        big = decoder.big
        if big is not None:  # (it came before the bodies of this read)
            decoder.big = None
            bodies = [big, *bodies]
        fill = decoder.filling
        if fill is not None:
            self.link.read_into(fill)
        if self._authenticating:  # (reading is paused; bytes already on their way)
            self._after_auth.extend(bodies)
            return
        if bodies:
            self._handle_bodies(bodies)
            if self._halted():
                return  # (authenticating: the rest, a framing error too, comes after it)
        self._after_frames(bool(bodies), now)

    def _after_frames(self, progressed: bool, now: float) -> None:
        decoder = self.decoder
        if decoder.error is not None:
            self.reply_error(decoder.error)
            return
        self._stall.after_read(decoder.buffered, progressed, now)

    def check_timers(self, now: float, keepalive: float, frame_timeout: float) -> None:
        """Close a client that went silent, or that stalled halfway through a frame."""
        if self._state is _CLOSED:
            return
        if self.link.reading_paused:
            self._last_rx = now  # we stopped reading, so its silence is ours
            return
        if self._stall.stalled(now, frame_timeout):
            self.log.warning("incomplete frame timed out", buffered=self.decoder.buffered)
            self.send_error("", ErrorCode.INVALID_MESSAGE, "incomplete frame timed out")
            self.close()
        elif now - self._last_rx > keepalive:
            self.log.info("keep-alive timeout", idle_s=round(now - self._last_rx, 1))
            self.shutdown("keepalive_timeout")

    def _handle_bodies(self, bodies: list[Body]) -> None:
        """Run the frames of one read. Acks are gathered and settled together (before the
        next frame of another kind, so the order of effects stays the frames' order) and
        only free capacity here; the queues they freed are refilled once, after the batch."""
        self._batching = True
        acks: list[str] = []
        limits = self.limits
        try:
            for index, body in enumerate(bodies):
                if not isinstance(body, bytes):
                    if acks:
                        self._settle_acks(acks)
                        acks = []
                    if isinstance(body, Split):
                        self._handle_split(body)
                    else:
                        self._join_off_loop(body)
                    if self._state is _CLOSED:
                        break
                    if self._authenticating:
                        self._after_auth = bodies[index + 1 :]
                        break
                    continue
                if body[1:2] == _ACK_TYPE and self._state is _OPEN:
                    target = peek_ack_target(body, limits)
                    if target is not None:
                        acks.append(target)
                        continue
                if acks:
                    self._settle_acks(acks)
                    acks = []
                self._handle_body(body)
                if self._state is _CLOSED:
                    break
                if self._authenticating:
                    self._after_auth = bodies[index + 1 :]
                    break
            if acks:
                self._settle_acks(acks)
        finally:
            self._batching = False
            self._refill()

    def _settle_acks(self, msg_ids: list[str]) -> None:
        """Settle the deliveries named by a run of Acks: each at the subscription holding
        it (the first, in subscription order), without refilling yet."""
        ack_many = self.manager.ack_many
        if self._holders is not None:
            msg_ids = self._settle_held(msg_ids, self._holders)
            if not msg_ids:
                return
        for sub in self.subs.values():
            left = ack_many(sub, msg_ids)
            if len(left) != len(msg_ids) and sub.queue.count:
                self._acked[sub.queue.name] = sub.queue
            if not left:
                return
            msg_ids = left
        for msg_id in msg_ids:
            self.log.debug("ack for unknown delivery", message_id=msg_id)

    def _settle_held(self, msg_ids: list[str], holders: dict[str, Subscription]) -> list[str]:
        """Settle the Acks whose subscription ``holders`` names; the ids left for the scan in
        subscription order (unknown, or no longer held there)."""
        rest = self.manager.ack_held(holders, msg_ids, self._acked)
        if len(holders) > self._holders_limit:
            holders.clear()
        return rest

    def _refill(self) -> None:
        if self._acked:
            queues, self._acked = self._acked, {}
            for queue in queues.values():
                if not queue.deleted and queue.count:
                    queue.dispatch()

    def _handle_body(self, body: bytes) -> None:
        """Decode and run one frame body; protocol errors become Error replies."""
        try:
            msg = decode_body(body, self.limits)
            self._run(msg)
        except ProtocolError as exc:
            self.reply_error(exc)

    def _handle_split(self, split: Split) -> None:
        """A frame with a large payload, its payload apart: the rest decoded, then run."""
        try:
            msg = decode_body(split.skeleton, self.limits)
            msg.payload = split.payload
            if split.json_ok:
                self._json_ok = split.payload
            self._run(msg)
        except ProtocolError as exc:
            self.reply_error(exc)
        self._json_ok = b""

    def _run(self, msg: Message) -> None:
        """One decoded message to its handler, or refused in this state."""
        if msg.type is _PUBLISH and self._state is _OPEN:
            self.on_publish(msg)  # (the state table's entry, called without the table)
            return
        handler = self._handlers[msg.type]
        if handler is None:
            raise self._refusal(msg)
        handler(self, msg)

    def _join_off_loop(self, frame: BigFrame) -> None:
        """A big frame: the rest of it is decoded here, its payload (the one copy of ~64 MiB,
        ~50 ms) joined from the reads in a worker thread with the GIL released, so the other
        connections are served meanwhile. This one's later frames wait for it, as for the
        JSON check (``_after_auth``, reading paused), so their order is kept."""
        cut = frame.split()
        if cut is None:  # the lengths do not add up: the whole body decoded names the defect
            self._handle_body(frame.body())
            return
        skeleton, start, stop = cut
        try:
            msg = decode_body(skeleton, self.limits)
        except ProtocolError as exc:
            self.reply_error(exc)
            return
        parts = frame.parts
        self._authenticating = True
        self.link.pause_reading()
        self.link.offload(
            lambda: _join_range(parts, start, stop), lambda payload: self._joined(msg, payload)
        )

    def _joined(self, msg: Message, payload: bytes) -> None:
        self._authenticating = False
        whole = Message(
            msg.type,
            msg.id,
            msg.queue,
            payload,
            msg.headers,
            msg.error_code,
            msg.error_message,
            msg.version,
        )
        try:
            handler = self._handlers[whole.type]
            if handler is None:
                raise self._refusal(whole)
            handler(self, whole)
        except ProtocolError as exc:
            self.reply_error(exc)
        if self._halted():  # (closed, or the payload's JSON check went off the loop too)
            return
        self._resume()

    def _refusal(self, msg: Message) -> ProtocolError:
        if self.state is State.AWAITING_CONNECT:
            return ProtocolError(
                ErrorCode.NOT_AUTHENTICATED, "send Connect first", message_id=msg.id
            )
        if msg.type in _SERVER_TO_CLIENT:
            what = f"{msg.type.name} is sent by the server, not by clients"
            return ProtocolError(ErrorCode.INVALID_MESSAGE, what, message_id=msg.id)
        return ProtocolError(ErrorCode.INVALID_MESSAGE, "connection is closing", message_id=msg.id)

    def reply_error(self, exc: ProtocolError) -> None:
        # A client stuck in a loop of bad messages must not flood the log: the first few
        # errors of a connection are warnings, the rest debug lines.
        self._errors_logged += 1
        level = self.log.warning if self._errors_logged <= _LOUD_ERRORS else self.log.debug
        level(
            "protocol error",
            code=str(exc.code),
            detail=exc.message,
            message_id=exc.message_id,
            count=self._errors_logged,
        )
        if self._errors_logged == _LOUD_ERRORS:
            self.log.warning("further protocol errors of this connection are logged at debug")
        self.send_error(exc.message_id, exc.code, exc.message, in_order=not exc.fatal)
        if exc.fatal:
            self.close()

    def send_error(
        self, msg_id: str, code: ErrorCode, text: str, *, in_order: bool = False
    ) -> None:
        """``in_order``: behind the PublishAcks waiting for the journal, if any (a frame's
        reply must not overtake an earlier frame's: a big payload checked off the loop can
        be refused before the publish ahead of it is on disk)."""
        self.stats.error(str(code))
        if not msg_id:
            # An Error always carries an id; when no request can be named, make one up.
            self._error_seq += 1
            msg_id = f"err_{self.conn_id}_{self._error_seq}"
        error = Message(CommandType.ERROR, msg_id, error_code=code, error_message=text)
        durable = self._durable
        if in_order and durable is not None and durable.follow(error):
            return
        self.link.send(encode(error))

    def _reply(
        self,
        kind: CommandType,
        msg: Message,
        headers: Mapping[str, str] | None = None,
        payload: bytes = b"",
    ) -> None:
        self.link.send(encode(Message(kind, msg.id, msg.queue, payload, headers or {})))

    def close(self) -> None:
        self.state = State.CLOSED
        self.link.close()

    # -- handlers ----------------------------------------------------------------------------

    def on_connect(self, msg: Message) -> None:
        # A token, or a user name and password (headers), or a verified client certificate,
        # or nothing: anonymous.
        headers = msg.headers
        peer = self.link.peer_host
        identity = self.link.peer_identity
        if "username" in headers or "password" in headers:
            # A password's hash is verified off the loop: what follows waits for it.
            if not self.auth.login(
                headers.get("username"),
                headers.get("password", ""),
                peer,
                "vibemq",
                lambda verdict: self._connect_verdict(msg, verdict),
                self.link.offload,
            ):
                self._authenticating = True
                self.link.pause_reading()
            return
        if identity and "authToken" not in headers:
            # A client certificate verified in the TLS handshake is a login (as AMQP's
            # EXTERNAL): its CN is the user.
            verdict = Verdict(Outcome.ACCEPTED, identity)
        else:
            verdict = self.auth.authenticate_token(headers.get("authToken"), peer, "vibemq")
        self._connect_verdict(msg, verdict)

    def _connect_verdict(self, msg: Message, verdict: Verdict) -> None:
        resumed, self._authenticating = self._authenticating, False
        self._apply_verdict(msg, verdict)
        if not resumed or self._state is _CLOSED:
            return
        # The password was verified off the loop: the frames that came after the Connect.
        self._resume()

    def _resume(self) -> None:
        """After work off the loop (a login, a big payload's check): reading resumes (unless
        the memory watermark or a full queue holds it) and the frames held meanwhile run."""
        if not self._memory_paused and not self._deferred:
            self.link.resume_reading()
        held, self._after_auth = self._after_auth, []
        if held:
            self._handle_bodies(held)
            if self._halted():
                return
        self._after_frames(bool(held), self.link.time())

    def _halted(self) -> bool:
        """Closed, or (again) waiting for a login's verdict or a big payload's check."""
        return self._state is _CLOSED or self._authenticating

    def _apply_verdict(self, msg: Message, verdict: Verdict) -> None:
        if verdict.user is None:
            if verdict.outcome is Outcome.CREDENTIALS_REQUIRED:
                code, text = ErrorCode.AUTH_REQUIRED, "authentication token required"
            else:
                code, text = ErrorCode.AUTH_FAILED, "Invalid authentication token"
            self._refuse_auth(msg, code, text, verdict.delay)
            return
        self.user = verdict.user
        self.client_version = msg.headers.get("clientVersion")
        self.access = self.auth.access(verdict.user, self.conn_id)
        self.state = State.OPEN
        self.log = self.log.bind(user=verdict.user)
        self.log.info("client connected", client_version=msg.headers.get("clientVersion"))
        headers = {"serverVersion": __version__, "connectionId": self.conn_id}
        self.link.send(encode(Message(CommandType.CONNECT_ACK, msg.id, headers=headers)))

    def _refuse_auth(self, msg: Message, code: ErrorCode, text: str, delay: float) -> None:
        """The refusal is held back ``delay`` seconds (reading paused, nothing handled), so
        that guesses from one address cannot run at line rate."""
        self.log.warning("authentication refused", code=str(code))
        self.state = State.CLOSED
        if delay <= 0:
            self.send_error(msg.id, code, text)
            self.link.close()
            return
        self.link.pause_reading()

        def refuse() -> None:
            self.send_error(msg.id, code, text)
            self.link.close()

        self.link.call_later(delay, refuse)

    def on_connect_again(self, msg: Message) -> None:
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, "already connected", message_id=msg.id)

    def on_disconnect(self, msg: Message) -> None:
        self.log.info("client disconnected", reason=msg.headers.get("reason", "client_request"))
        self.close()

    def on_ping(self, msg: Message) -> None:
        self.link.send(encode(Message(CommandType.PONG, msg.id)))

    def on_client_error(self, msg: Message) -> None:
        self.log.info("client reported error", code=msg.error_code, detail=msg.error_message)

    def _queue_name(self, msg: Message) -> str:
        # An existing queue's name was validated when it was created; "$" queues are the
        # adapters' internal state and out of clients' reach.
        name = msg.queue
        if (name not in self.manager.queues or name[:1] == "$") and not valid_queue_name(name):
            raise ProtocolError(
                ErrorCode.INVALID_QUEUE,
                "queue name must be 1..256 letters, digits, '-', '_' or '.'",
                message_id=msg.id,
            )
        return msg.queue

    def _core_error(self, msg: Message, exc: CoreError) -> ProtocolError:
        return ProtocolError(_CORE_ERRORS[type(exc)], str(exc), message_id=msg.id)

    def _permit(self, operation: Operation, msg: Message, name: str) -> None:
        """NOT_AUTHORIZED unless the user may do ``operation`` on the queue (docs/security.md)."""
        if not self.access.allowed(operation, name):
            raise ProtocolError(
                ErrorCode.NOT_AUTHORIZED,
                f"{operation.label} access to queue '{name}' refused for user '{self.access.user}'",
                message_id=msg.id,
            )

    def _permit_auto_create(self, msg: Message, name: str) -> None:
        """A publish or subscribe that would create its queue creates something: it needs
        configure on the queue as well (as a CreateQueue would)."""
        if name not in self.manager.queues and self.manager.auto_create:
            self._permit(Operation.CONFIGURE, msg, name)

    def on_publish(self, msg: Message) -> None:
        self.stats.messages_received += 1
        queue = msg.queue
        if queue not in self.manager.queues or queue.startswith("$"):
            self._queue_name(msg)  # (raises unless the name is valid)
        # (everything: every operation is allowed anywhere; read from the Access each time,
        # not kept on the session: a users-file reload updates the Access in place)
        if not self.access.everything:
            self._permit(Operation.WRITE, msg, queue)
            self._permit_auto_create(msg, queue)
        payload = msg.payload
        if payload and payload is not self._json_ok:  # (not checked as it landed)
            if _JSON_OFF_LOOP and len(payload) >= _JSON_OFFLOAD_FROM:
                self._check_off_loop(msg)
                return
            if not _json_valid(payload):
                validate_json(payload, msg.id)  # (raises INVALID_PAYLOAD)
        self._publish_checked(msg)

    def _check_off_loop(self, msg: Message) -> None:
        """A big payload's JSON check runs in a worker thread (it releases the GIL: the
        other connections go on). This one's later frames wait for it, as for a login's
        verdict: held in ``_after_auth``, reading paused, so their order is kept."""
        payload = msg.payload
        self._authenticating = True
        self.link.pause_reading()
        self.link.offload(lambda: _json_valid(payload), lambda ok: self._checked(msg, ok))

    def _checked(self, msg: Message, ok: bool) -> None:
        self._authenticating = False
        try:
            if not ok:
                validate_json(msg.payload, msg.id)  # (raises INVALID_PAYLOAD)
            self._publish_checked(msg)
        except ProtocolError as exc:
            self.reply_error(exc)
        if self._state is _CLOSED:
            return
        self._resume()

    def _publish_checked(self, msg: Message) -> None:
        """The rest of a Publish, once its payload is known to be JSON."""
        if self._rate and not self._take_token():
            raise ProtocolError(
                ErrorCode.RATE_LIMITED,
                f"more than {self._rate:g} publishes per second",
                message_id=msg.id,
            )
        if self._deferred:
            self._deferred.append(msg)
            return
        self._publish(msg)
        if self.manager.memory_blocked and not self._memory_paused:
            self._memory_paused = True
            self.log.info("publisher paused: memory high watermark")
            self.link.pause_reading()
            self.manager.wait_for_memory(self._memory_ok)

    def _publish(self, msg: Message) -> bool:
        """Publish one message; False when it must wait for room (BlockPublisher)."""
        try:
            outcome = self.manager.publish(msg.queue, msg.id, msg.payload, msg.headers)
        except CoreError as exc:
            self.reply_error(self._core_error(msg, exc))
            return True
        if outcome is _ACCEPTED:
            self._put(encode_publish_ack(msg.id, msg.queue))
            return True
        if outcome is _ACCEPTED_DURABLE:
            self._await_durable(msg)
            return True
        if outcome is PublishOutcome.REJECTED_FULL:
            self.send_error(msg.id, ErrorCode.QUEUE_FULL, f"queue {msg.queue!r} is full")
            return True
        if not self._deferred:
            self._deferred = deque((msg,))  # (not the shared empty one)
        self.link.pause_reading()
        self.manager.wait_for_room(msg.queue, lambda: self.link.call_soon(self._retry_deferred))
        return False

    def _await_durable(self, msg: Message) -> None:
        """PublishAck only once the journal has the message; never a false one."""
        durable = self._durable
        if durable is None:
            persistence = self.manager.persistence
            assert persistence is not None  # the core says ACCEPTED_DURABLE only with one
            durable = self._durable = DurableReplies(persistence, self._durable_acks)
        durable.add(msg)

    def _durable_acks(self, batch: list[Message], err: Exception | None) -> None:
        if self.state is State.CLOSED:
            return
        # (Errors of later frames wait here too, to keep the replies' order: send_error.)
        if err is None:
            # (the PublishAcks in one C call and one buffer: their ids and queues gathered
            # into a list made at its size, no frame object a message; a batch that holds an
            # error frame, rare, is joined from frames)
            echoes = [""] * (2 * len(batch))
            at = 0
            for m in batch:
                if m.type is _ERROR:
                    break
                echoes[at] = m.id
                echoes[at + 1] = m.queue
                at += 2
            else:
                self.link.send(encode_publish_acks(echoes))
                return
            self.link.send(
                b"".join(
                    [
                        encode(m) if m.type is _ERROR else encode_publish_ack(m.id, m.queue)
                        for m in batch
                    ]
                )
            )
            return
        for msg in batch:
            if msg.type is _ERROR:
                self.link.send(encode(msg))
            else:
                self.send_error(msg.id, ErrorCode.SERVER_ERROR, f"message not stored: {err}")

    def _retry_deferred(self) -> None:
        if self.state is State.CLOSED:
            return
        while self._deferred:
            if not self._publish(self._deferred[0]):
                return
            self._deferred.popleft()
        if not self._memory_paused:
            self.link.resume_reading()

    def _memory_ok(self) -> None:
        self._memory_paused = False
        if not self._deferred and self.state is not State.CLOSED:
            self.log.info("publisher resumed")
            self.link.resume_reading()

    def _take_token(self) -> bool:
        now = self.link.time()
        self._tokens = min(self._burst, self._tokens + (now - self._refilled) * self._rate)
        self._refilled = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False

    def on_subscribe(self, msg: Message) -> None:
        queue = self._queue_name(msg)
        self._permit(Operation.READ, msg, queue)
        if not self.access.everything:
            self._permit_auto_create(msg, queue)
        prefetch = self.config.default_prefetch
        raw = msg.headers.get("prefetch")
        if raw is not None:
            if not raw.isdigit() or not 1 <= int(raw) <= self.config.max_prefetch:
                raise ProtocolError(
                    ErrorCode.INVALID_MESSAGE,
                    f"prefetch must be 1..{self.config.max_prefetch}",
                    message_id=msg.id,
                )
            prefetch = int(raw)
        try:
            sub = self.manager.subscribe(queue, msg.id, self, prefetch, dispatch=False)
        except CoreError as exc:
            raise self._core_error(msg, exc) from None
        self.subs[queue] = sub
        sub.label = queue_piece(sub.queue.name)  # (what each Deliver of it carries)
        self._holders_limit += 2 * prefetch
        if len(self.subs) > 1 and self._holders is None:
            self._holders = {}
        self._reply(CommandType.SUBSCRIBE_ACK, msg, {"queueName": queue, "subscriptionId": sub.id})
        sub.queue.dispatch()

    def on_unsubscribe(self, msg: Message) -> None:
        queue = self._queue_name(msg)
        sub = self.subs.pop(queue, None)
        if sub is not None:
            self.manager.unsubscribe(sub)
        self._reply(CommandType.UNSUBSCRIBE_ACK, msg, {"queueName": queue})

    def on_ack(self, msg: Message) -> None:
        self._ack(msg.headers.get("messageId") or msg.id)

    def _ack(self, msg_id: str) -> None:
        ack = self.manager.ack
        for sub in self.subs.values():
            if ack(sub, msg_id, dispatch=False):
                self._acked[sub.queue.name] = sub.queue
                if not self._batching:
                    self._refill()
                return
        self.log.debug("ack for unknown delivery", message_id=msg_id)

    def on_create_queue(self, msg: Message) -> None:
        queue = self._queue_name(msg)
        self._permit(Operation.CONFIGURE, msg, queue)
        raw: dict[str, Any] = {}
        if msg.payload:
            validate_json(msg.payload, msg.id)
            parsed = json.loads(msg.payload)
            if not isinstance(parsed, dict):
                raise ProtocolError(
                    ErrorCode.INVALID_PAYLOAD,
                    "CreateQueue payload must be a JSON object of options",
                    message_id=msg.id,
                )
            raw.update(parsed)
        raw.update({k: v for k, v in msg.headers.items() if k in _OPTION_HEADERS})
        try:
            options = self.manager.options_from(raw)
            dlq = options.dead_letter_queue_name or f"{queue}.dlq"
            if options.enable_dead_letter_queue and not valid_queue_name(dlq):
                raise InvalidQueueOptions(f"invalid dead-letter queue name {dlq!r}")
            self.manager.create_queue(queue, options)
        except CoreError as exc:
            raise self._core_error(msg, exc) from None
        self._reply_when_durable(CommandType.CREATE_QUEUE, msg, options.durable)

    def on_delete_queue(self, msg: Message) -> None:
        queue = self._queue_name(msg)
        self._permit(Operation.CONFIGURE, msg, queue)
        try:
            durable = self.manager.get(queue).options.durable
            self.manager.delete_queue(queue)
        except CoreError as exc:
            raise self._core_error(msg, exc) from None
        self._reply_when_durable(CommandType.DELETE_QUEUE, msg, durable)

    def _reply_when_durable(self, kind: CommandType, msg: Message, durable: bool) -> None:
        """Confirm a queue operation only once the journal has it (durable queues)."""
        persistence = self.manager.persistence
        if not durable or persistence is None:
            self._reply(kind, msg)
            return

        def done(err: Exception | None) -> None:
            if self.state is State.CLOSED:
                return
            if err is None:
                self._reply(kind, msg)
            else:
                self.send_error(msg.id, ErrorCode.SERVER_ERROR, f"not stored: {err}")

        persistence.when_durable(done)

    def on_queue_info(self, msg: Message) -> None:
        queue = self._queue_name(msg)
        self._permit(Operation.READ, msg, queue)
        try:
            info = self.manager.queue_info(queue)
        except CoreError as exc:
            raise self._core_error(msg, exc) from None
        self._reply(CommandType.QUEUE_INFO, msg, payload=_json(info))

    def on_list_queues(self, msg: Message) -> None:
        # Internal queues ("$mqtt...") are the adapters' own state, not the user's.
        names = sorted(n for n in self.manager.queues if not n.startswith("$"))
        self._reply(CommandType.LIST_QUEUES, msg, payload=_json(names))

    # -- the core's Consumer interface -------------------------------------------------------

    @property
    def writable(self) -> bool:
        state = self._link_state
        if state is not None:
            return self._state is _OPEN and state.writable
        return self._state is _OPEN and self.link.writable

    def _put(self, frame: bytes) -> None:
        """One frame of the hot path (a PublishAck, a Deliver) to the link: through its
        LinkState natively when it has one."""
        state = self._link_state
        if state is not None:
            state.send(frame)
        else:
            self._send(frame)

    def deliver(self, sub: Subscription, msg: StoredMessage) -> None:
        self.stats.messages_sent += 1
        if self._holders is not None:
            self._holders[msg.id] = sub
        payload = msg.payload
        headers = msg.headers
        if headers and headers.get(PAYLOAD_ENCODING) == RAW:
            # A byte protocol's bytes: their VibeMQ form, computed per delivery (a raw
            # message reaching a VibeMQ consumer is the cross-protocol case, rarely fanned out).
            payload, headers = as_vibemq(payload, headers)
        piece = sub.label
        if len(piece) == 0:  # (not subscribed through on_subscribe)
            piece = queue_piece(msg.queue)
        if len(payload) < LARGE_PAYLOAD:
            self._put(encode_deliver_named(msg.id, piece, payload, headers, msg.attempts))
        else:  # the payload as its own buffer, the transport writes it without a copy (in
            # one call through the Link: each is a generic call, three sends cost three)
            self.link.send_parts(deliver_parts(msg.id, piece, payload, headers, msg.attempts))

    def deliver_many(self, sub: Subscription, msgs: list[StoredMessage]) -> None:
        """A run of a FanOutWithoutAck queue: the same list for each of its subscribers, so
        its Deliver frames are built and joined for the first and reused by the others
        (nothing in them is per connection)."""
        self.stats.messages_sent += len(msgs)
        last = _LAST_RUN
        if msgs is not last.msgs:
            last.data = b"".join([_deliver_frame(m) for m in msgs])
            last.msgs = msgs
        self.link.send(last.data)

    def subscription_cancelled(self, sub: Subscription, reason: str) -> None:
        queue = sub.queue.name
        if self.subs.get(queue) is sub:
            del self.subs[queue]
        headers = {"queueName": queue, "reason": reason}
        self.link.send(encode(Message(CommandType.UNSUBSCRIBE_ACK, sub.id, queue, headers=headers)))

    # -- transport events --------------------------------------------------------------------

    def writable_again(self) -> None:
        for sub in list(self.subs.values()):
            sub.queue.dispatch()

    def shutdown(self, reason: str) -> None:
        """Tell the client the server is going away, then close once the writes are out."""
        if self.state is State.CLOSED:
            self.link.close()
            return
        self._error_seq += 1
        disconnect = Message(
            CommandType.DISCONNECT, f"disc_{self.conn_id}", headers={"reason": reason}
        )
        self.link.send(encode(disconnect))
        self.close()

    def close_by_operator(self, reason: str) -> None:
        """Disconnect with ``reason: closed_by_operator: <reason>`` (the client library keeps
        it as ``disconnect_reason``), then close."""
        self.log.info("connection closed by operator", reason=reason)
        self.shutdown(f"closed_by_operator: {reason}")

    def describe(self) -> SessionInfo:
        consumers = tuple(
            ConsumerInfo(queue, sub.id, sub.prefetch, sub.n_held)
            for queue, sub in self.subs.items()
        )
        return SessionInfo(
            "vibemq",
            self.user,
            self.client_version,
            self._state.value,
            consumers=consumers,
            details={"clientVersion": self.client_version},
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self.state = State.CLOSED
        subs, self.subs = list(self.subs.values()), {}
        for sub in subs:
            self.manager.unsubscribe(sub)
        if self._deferred:
            self.log.info("unacknowledged publishes discarded", count=len(self._deferred))
            self._deferred.clear()


class _LastRun:
    """The Deliver frames built last for a run (``Session.deliver_many``), and the run."""

    __slots__ = ("data", "msgs")

    def __init__(self) -> None:
        self.msgs: list[StoredMessage] | None = None
        self.data = b""


# Shared by every native session: the subscribers of a fan-out are different sessions.
_LAST_RUN: Final = _LastRun()


def _json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


Handler = Callable[[Session, Message], None]

# The state machine: per state, the commands it accepts and the handler of each. A command
# missing from a state's row is refused (NOT_AUTHENTICATED before Connect).
_TRANSITIONS: dict[State, dict[CommandType, Handler]] = {
    State.AWAITING_CONNECT: {
        CommandType.CONNECT: Session.on_connect,
        CommandType.DISCONNECT: Session.on_disconnect,
    },
    State.OPEN: {
        CommandType.CONNECT: Session.on_connect_again,
        CommandType.DISCONNECT: Session.on_disconnect,
        CommandType.PING: Session.on_ping,
        CommandType.PUBLISH: Session.on_publish,
        CommandType.SUBSCRIBE: Session.on_subscribe,
        CommandType.UNSUBSCRIBE: Session.on_unsubscribe,
        CommandType.ACK: Session.on_ack,
        CommandType.CREATE_QUEUE: Session.on_create_queue,
        CommandType.DELETE_QUEUE: Session.on_delete_queue,
        CommandType.QUEUE_INFO: Session.on_queue_info,
        CommandType.LIST_QUEUES: Session.on_list_queues,
        CommandType.ERROR: Session.on_client_error,
    },
    State.CLOSED: {},
}

# The same table as lists indexed by the type byte: no hashing on the hot path.
_HANDLERS: dict[State, list[Handler | None]] = {
    state: [
        row.get(CommandType(t)) if t in CommandType._value2member_map_ else None for t in range(256)
    ]
    for state, row in _TRANSITIONS.items()
}


def _deliver_frame(m: StoredMessage) -> bytes:
    """The Deliver frame of ``m`` in the VibeMQ form (a byte protocol's raw bytes converted)."""
    payload = m.payload
    headers = m.headers
    if headers and headers.get(PAYLOAD_ENCODING) == RAW:
        payload, headers = as_vibemq(payload, headers)
    return encode_deliver(m.id, m.queue, payload, headers, m.attempts)
