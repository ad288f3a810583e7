"""Which permission each AMQP method needs, as RabbitMQ's access control table says
(https://www.rabbitmq.com/docs/access-control): a refusal closes the channel with 403
``ACCESS_REFUSED - access to queue 'q' in vhost '/' refused for user 'u'``.

| method | needs |
| --- | --- |
| exchange.declare (not passive), exchange.delete | configure on the exchange |
| queue.declare (not passive), queue.delete | configure on the queue |
| queue.bind / unbind | write on the queue, read on the exchange |
| exchange.bind / unbind | write on the destination, read on the source |
| queue.purge, basic.get, basic.consume | read on the queue |
| basic.publish | write on the exchange (the default exchange is ``amq.default``) |

The default exchange and ``amq.topic`` are also doors into the address space every protocol
shares (docs/architecture.md), so, beyond RabbitMQ's table, what passes through them is
checked on the address too, as an MQTT or native client is: a publish to the default
exchange needs write on its routing key (the queue), one to ``amq.topic`` write on its
routing key (the topic; RabbitMQ's topic permissions), and a binding from ``amq.topic`` read
on its binding key; so no protocol reaches an address another would refuse.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pamqp import commands

from vibemq_server.adapters.amqp.codec import AmqpError, ReplyCode
from vibemq_server.core.permissions import Access, Operation

C, W, R = Operation.CONFIGURE, Operation.WRITE, Operation.READ

#: one check: (operation, resource kind, the resource's name in the method; None = no check)
Check = tuple[Operation, str, Callable[[Any], str | None]]


def _unless_passive(name: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    return lambda m: None if m.passive else name(m)


TOPIC_EXCHANGE = "amq.topic"
#: how a refusal names each kind of resource
_WORDS = {
    "queue": "queue '{}'",
    "exchange": "exchange '{}'",
    "address": "queue '{}'",
    "topic": "topic '{}' in exchange 'amq.topic'",
}


def _on_topic(
    key: Callable[[Any], str], exchange: Callable[[Any], str]
) -> Callable[[Any], str | None]:
    return lambda m: key(m) if exchange(m) == TOPIC_EXCHANGE else None


_PUBLISH: list[Check] = [
    (W, "exchange", lambda m: m.exchange or "amq.default"),
    (W, "address", lambda m: m.routing_key or None if not m.exchange else None),
    (W, "topic", _on_topic(lambda m: m.routing_key, lambda m: m.exchange)),
]

NEEDS: dict[type, list[Check]] = {
    commands.Exchange.Declare: [(C, "exchange", _unless_passive(lambda m: m.exchange))],
    commands.Exchange.Delete: [(C, "exchange", lambda m: m.exchange)],
    commands.Exchange.Bind: [
        (W, "exchange", lambda m: m.destination),
        (R, "exchange", lambda m: m.source),
        (R, "topic", _on_topic(lambda m: m.routing_key, lambda m: m.source)),
    ],
    commands.Exchange.Unbind: [
        (W, "exchange", lambda m: m.destination),
        (R, "exchange", lambda m: m.source),
    ],
    # A server-named queue (empty name) is checked by the handler once it has its amq.gen-*
    # name, as RabbitMQ checks it.
    commands.Queue.Declare: [(C, "queue", _unless_passive(lambda m: m.queue or None))],
    commands.Queue.Delete: [(C, "queue", lambda m: m.queue)],
    commands.Queue.Bind: [
        (W, "queue", lambda m: m.queue),
        (R, "exchange", lambda m: m.exchange),
        (R, "topic", _on_topic(lambda m: m.routing_key, lambda m: m.exchange)),
    ],
    commands.Queue.Unbind: [
        (W, "queue", lambda m: m.queue),
        (R, "exchange", lambda m: m.exchange),
    ],
    commands.Queue.Purge: [(R, "queue", lambda m: m.queue)],
    commands.Basic.Get: [(R, "queue", lambda m: m.queue)],
    commands.Basic.Consume: [(R, "queue", lambda m: m.queue)],
    commands.Basic.Publish: _PUBLISH,
}


def check(access: Access, method: Any, channel: int, last_queue: str, ids: tuple[int, int]) -> None:
    """Raise the channel's 403 unless ``access`` allows what ``method`` needs (an empty
    queue name is the channel's last declared queue, as the handlers take it)."""
    for operation, kind, name_of in NEEDS.get(type(method), ()):
        name = name_of(method)
        if name is None:
            continue
        if kind == "queue" and not name:
            name = last_queue
        require(access, operation, kind, name, channel, ids)


def require(
    access: Access, operation: Operation, kind: str, name: str, channel: int, ids: tuple[int, int]
) -> None:
    """Raise the channel's 403 unless ``access`` allows ``operation`` on ``name``."""
    if not access.allowed(operation, name):
        raise AmqpError(
            ReplyCode.ACCESS_REFUSED,
            f"ACCESS_REFUSED - access to {_WORDS[kind].format(name)} in vhost '/' refused "
            f"for user '{access.user}'",
            channel,
            *ids,
        )
