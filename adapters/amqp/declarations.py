"""The handlers of exchange.* and queue.* methods: declare, delete, bind, unbind, purge.

Exchanges and bindings are the core's (``core.exchanges``); a queue's arguments the core's
options do not hold, exclusive and auto-delete queues are the server's (``base.Server``).
RabbitMQ's reply codes and texts: 404 for what is not there, 406 for an inequivalent
redeclaration, 403 for reserved names, 405 for another connection's exclusive queue.
"""

from __future__ import annotations

import contextlib

from pamqp import commands

from vibemq_server.adapters.amqp.arguments import validate_arguments
from vibemq_server.adapters.amqp.channel import Channel, consumer_count
from vibemq_server.adapters.amqp.codec import AmqpError, ReplyCode, encode_method, text
from vibemq_server.adapters.amqp.handshake import HandshakeMethods
from vibemq_server.adapters.amqp.permissions import require
from vibemq_server.core.exchanges import ExchangeNotFound
from vibemq_server.core.permissions import Operation


class DeclarationMethods(HandshakeMethods):
    __slots__ = ()

    # exchanges

    def ex_declare(self, channel: Channel, method: commands.Exchange.Declare) -> None:
        exchanges = self._exchanges()
        name = text(method.exchange)
        exchanges.declare(
            name,
            text(method.exchange_type),  # "" too is refused (503), as RabbitMQ does
            durable=bool(method.durable),
            auto_delete=bool(method.auto_delete),
            internal=bool(method.internal),
            arguments=dict(method.arguments or {}),
            passive=bool(method.passive),
        )
        if not method.nowait:
            self.send(encode_method(channel.number, commands.Exchange.DeclareOk()))

    def ex_delete(self, channel: Channel, method: commands.Exchange.Delete) -> None:
        # RabbitMQ answers delete-ok for an exchange that is not there.
        with contextlib.suppress(ExchangeNotFound):
            self._exchanges().delete(text(method.exchange), if_unused=bool(method.if_unused))
        if not method.nowait:
            self.send(encode_method(channel.number, commands.Exchange.DeleteOk()))

    def ex_bind(self, channel: Channel, method: commands.Exchange.Bind) -> None:
        self._exchanges().bind_exchange(
            text(method.destination),
            text(method.source),
            text(method.routing_key),
            dict(method.arguments or {}),
        )
        if not method.nowait:
            self.send(encode_method(channel.number, commands.Exchange.BindOk()))

    def ex_unbind(self, channel: Channel, method: commands.Exchange.Unbind) -> None:
        self._exchanges().unbind_exchange(
            text(method.destination),
            text(method.source),
            text(method.routing_key),
            dict(method.arguments or {}),
        )
        if not method.nowait:
            self.send(encode_method(channel.number, commands.Exchange.UnbindOk()))

    # queues

    def q_declare(self, channel: Channel, method: commands.Queue.Declare) -> None:
        server = self.server
        manager = self.manager
        name = text(method.queue)
        if not name:
            name = f"amq.gen-{server.next_msg_id()}"
            # RabbitMQ checks configure on the generated name too (a pattern may cover amq.gen-.*).
            require(self.access, Operation.CONFIGURE, "queue", name, channel.number, (50, 10))
        elif name.startswith("amq.") and not method.passive:
            raise AmqpError(
                ReplyCode.ACCESS_REFUSED,
                f"ACCESS_REFUSED - queue name '{name}' contains reserved prefix 'amq.*'",
                channel.number,
                50,
                10,
            )
        elif name.startswith("$") and not method.passive:
            # The adapters' own queues (the durable tables, MQTT sessions) are no client's,
            # and '$' is outside AMQP's queue-name domain, so no DeclareOk could even name one
            # (found by tests/unit/test_amqp_session_fuzz.py: a 541 on '$amqp.bindings').
            raise AmqpError(
                ReplyCode.ACCESS_REFUSED,
                f"ACCESS_REFUSED - queue name '{name}' contains reserved prefix '$'",
                channel.number,
                50,
                10,
            )
        self._check_exclusive(channel, name, 50, 10)
        existing = manager.queues.get(name)
        if method.passive:
            if existing is None or name.startswith("$"):
                raise AmqpError(
                    ReplyCode.NOT_FOUND,
                    f"NOT_FOUND - no queue '{name}' in vhost '/'",
                    channel.number,
                    50,
                    10,
                )
        else:
            args = method.arguments or {}  # a codec.FieldTable: it knows the wire types
            # RabbitMQ makes exclusive queues transient whatever the durable bit says.
            durable = bool(method.durable) and not method.exclusive
            if existing is None:
                validate_arguments(name, args)
                manager.create_queue(name, server.queue_options(durable, args))
                server.declared(name, durable, args)
                if method.exclusive:
                    server.exclusive[name] = self
                if method.auto_delete:
                    server.auto_delete.add(name)
            else:
                self._check_exclusive(channel, name, 50, 10, exclusive=bool(method.exclusive))
                server.check_redeclare(existing, durable, bool(method.auto_delete), args)
        channel.last_queue = name
        server.touch(name)
        if not method.nowait:
            count, consumers = server.message_count(name)
            self.send(
                encode_method(
                    channel.number,
                    commands.Queue.DeclareOk(
                        queue=name, message_count=count, consumer_count=consumers
                    ),
                )
            )

    def q_bind(self, channel: Channel, method: commands.Queue.Bind) -> None:
        name = self._queue_name(channel, text(method.queue))
        self._check_exclusive(channel, name, 50, 20)
        self._exchanges().bind_queue(
            name, text(method.exchange), text(method.routing_key), dict(method.arguments or {})
        )
        if not method.nowait:
            self.send(encode_method(channel.number, commands.Queue.BindOk()))

    def q_unbind(self, channel: Channel, method: commands.Queue.Unbind) -> None:
        name = self._queue_name(channel, text(method.queue))
        self._exchanges().unbind_queue(
            name, text(method.exchange), text(method.routing_key), dict(method.arguments or {})
        )
        self.send(encode_method(channel.number, commands.Queue.UnbindOk()))

    def q_purge(self, channel: Channel, method: commands.Queue.Purge) -> None:
        name = self._queue_name(channel, text(method.queue))
        self._check_exclusive(channel, name, 50, 30)
        count = self.manager.purge(name)
        if not method.nowait:
            self.send(encode_method(channel.number, commands.Queue.PurgeOk(message_count=count)))

    def q_delete(self, channel: Channel, method: commands.Queue.Delete) -> None:
        name = self._queue_name(channel, text(method.queue))
        self._check_exclusive(channel, name, 50, 40)
        queue = self.manager.queues.get(name)
        count = 0
        if queue is not None:
            if method.if_unused and consumer_count(queue):
                raise AmqpError(
                    ReplyCode.PRECONDITION_FAILED,
                    f"PRECONDITION_FAILED - queue '{name}' in vhost '/' in use",
                    channel.number,
                    50,
                    40,
                )
            if method.if_empty and queue.message_count:
                raise AmqpError(
                    ReplyCode.PRECONDITION_FAILED,
                    f"PRECONDITION_FAILED - queue '{name}' in vhost '/' is not empty",
                    channel.number,
                    50,
                    40,
                )
            count = self.server.delete_queue(name)
        if not method.nowait:
            self.send(encode_method(channel.number, commands.Queue.DeleteOk(message_count=count)))
