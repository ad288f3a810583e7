"""Which permission each AMQP method needs, as RabbitMQ's access control table says
(https://www.rabbitmq.com/docs/access-control): a refusal closes the channel with 403
``ACCESS_REFUSED - access to queue 'q' in vhost '/' refused for user 'u'``.

| method | needs |
| --- | --- |
| exchange.declare (not passive), exchange.delete | configure on the exchange |
| queue.declare (not passive, named), queue.delete | configure on the queue |
| queue.bind / unbind | write on the queue, read on the exchange |
| exchange.bind / unbind | write on the destination, read on the source |
| queue.purge, basic.get, basic.consume | read on the queue |
| basic.publish | write on the exchange (the default exchange is ``amq.default``) |
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


_PUBLISH: list[Check] = [(W, "exchange", lambda m: m.exchange or "amq.default")]

NEEDS: dict[type, list[Check]] = {
    commands.Exchange.Declare: [(C, "exchange", _unless_passive(lambda m: m.exchange))],
    commands.Exchange.Delete: [(C, "exchange", lambda m: m.exchange)],
    commands.Exchange.Bind: [
        (W, "exchange", lambda m: m.destination),
        (R, "exchange", lambda m: m.source),
    ],
    commands.Exchange.Unbind: [
        (W, "exchange", lambda m: m.destination),
        (R, "exchange", lambda m: m.source),
    ],
    # A server-named queue (empty name) is not checked: its name is made up by the broker.
    commands.Queue.Declare: [(C, "queue", _unless_passive(lambda m: m.queue or None))],
    commands.Queue.Delete: [(C, "queue", lambda m: m.queue)],
    commands.Queue.Bind: [(W, "queue", lambda m: m.queue), (R, "exchange", lambda m: m.exchange)],
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
        if not access.allowed(operation, name):
            raise AmqpError(
                ReplyCode.ACCESS_REFUSED,
                f"ACCESS_REFUSED - access to {kind} '{name}' in vhost '/' refused for user "
                f"'{access.user}'",
                channel,
                *ids,
            )
