"""Cross-protocol routing: every protocol's subscribers of an address, in one place.

An address is the name all protocols share: a VibeMQ queue name, an MQTT topic (``a/b`` is
``a.b``), an AMQP routing key on the default exchange or ``amq.topic``, a ZeroMQ message's
first frame. Each protocol adapter registers one :class:`AddressSink` that holds its own
subscriptions to addresses (MQTT topic filters, AMQP queues bound to ``amq.topic``, ZeroMQ
SUB prefixes). A publish at an address, from whichever protocol, is handed to every sink once
(``QueueManager.route`` or a native ``QueueManager.publish``): the publishing protocol's own
sink included, which is how an MQTT publish reaches the other MQTT sessions. No adapter ever
calls another one.

The message is handed over lazily: ``message()`` builds the core form of the publish
(protocol-neutral payload and headers) the first time a sink (or the queue of that name)
needs it, so that a publish only its own protocol's subscribers hear never pays for the
conversion; every call returns the same message. A sink told that the publish is its own
(``origin is self``) may ignore ``message`` and use the form it kept of it.
"""

from __future__ import annotations

from collections.abc import Callable

from vibemq_server.core.message import StoredMessage
from vibemq_server.core.native import mypyc_attr

#: The core form of the publish being routed, built on first call (the same one every call).
MessageSource = Callable[[], StoredMessage]


@mypyc_attr(allow_interpreted_subclasses=True)
class AddressSink:
    """One protocol's subscriptions to addresses; every protocol's sink subclasses it.

    A base class, not a Protocol: the compiled manager calls ``deliver`` through the
    class's vtable (every native publish, to every sink: MQTT's and AMQP's are always
    registered), where a Protocol's is a lookup by name with boxed arguments. Sinks written
    in Python (ZeroMQ's, the tests') are allowed and called the slow way."""

    __slots__ = ()

    def deliver(self, address: str, message: MessageSource, origin: AddressSink | None) -> bool:
        """Hand a publish at ``address`` to this protocol's subscribers that match it.

        ``origin``: the sink of the protocol that published it (``self`` for its own
        publishes), None for a native VibeMQ Publish. True when a copy was journaled: the
        publisher's acknowledgement (PUBACK, confirm, PublishAck) then waits for the journal.
        """
        raise NotImplementedError


def ready(msg: StoredMessage) -> MessageSource:
    """A message source for a message that exists already."""
    return lambda: msg


class AddressRouter:
    """The registered sinks, in registration order (the order ``QueueManager`` serves
    them in: a publish is handed to each once)."""

    __slots__ = ("sinks",)

    def __init__(self) -> None:
        # A tuple, replaced on change: a sink may (un)register while a publish is handed out.
        self.sinks: tuple[AddressSink, ...] = ()

    def register(self, sink: AddressSink) -> None:
        """Add a protocol's sink (once: registering it again changes nothing)."""
        if sink not in self.sinks:
            self.sinks = (*self.sinks, sink)

    def unregister(self, sink: AddressSink) -> None:
        self.sinks = tuple(s for s in self.sinks if s is not sink)
