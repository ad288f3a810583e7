"""The handlers of basic.*, confirm.select and tx.*: consumers, publishes, basic.get, acks,
publisher confirms and transactions.

A publish is complete once its content has arrived (``channel.Pending``): it is routed by the
server then, or kept for tx.commit. Its confirm goes out when the read is done, or, when a
copy was journaled, once the journal has made it durable (the core's ``DurableReplies``).
Acks, nacks and new consumers only mark queues to refill: the connection dispatches them
once per read.
"""

from __future__ import annotations

from typing import Any

from pamqp import commands

from vibemq_server.adapters.amqp.channel import (
    UNLIMITED,
    AmqpConsumer,
    Channel,
    Pending,
    _Getter,
    consumer_count,
)
from vibemq_server.adapters.amqp.codec import (
    AmqpError,
    GetOkEncoder,
    ReplyCode,
    encode_method,
    encode_nack,
    encode_return,
    text,
)
from vibemq_server.adapters.amqp.declarations import DeclarationMethods
from vibemq_server.adapters.amqp.states import Event, State
from vibemq_server.core.durable_replies import DurableReplies
from vibemq_server.protocol.bigcopy import BIG_FROM, join_range


class BasicMethods(DeclarationMethods):
    __slots__ = ()

    def b_qos(self, channel: Channel, method: commands.Basic.Qos) -> None:
        if method.global_:
            channel.global_prefetch = method.prefetch_count
            for consumer in channel.consumers.values():
                self.to_refill().add(consumer.queue)
        else:
            channel.prefetch = method.prefetch_count
        self.send(encode_method(channel.number, commands.Basic.QosOk()))

    def b_consume(self, channel: Channel, method: commands.Basic.Consume) -> None:
        name = self._queue_name(channel, text(method.queue))
        self._check_exclusive(channel, name, 60, 20)
        queue = self._existing_queue(channel, name, 60, 20)
        tag = text(method.consumer_tag) or channel.new_consumer_tag()
        if tag in channel.consumers:
            raise AmqpError(
                ReplyCode.NOT_ALLOWED,
                f"NOT_ALLOWED - attempt to reuse consumer tag '{tag}'",
                0,
                60,
                20,
            )
        if name in self.server.exclusive_consumers or (method.exclusive and consumer_count(queue)):
            raise AmqpError(
                ReplyCode.ACCESS_REFUSED,
                f"ACCESS_REFUSED - queue '{name}' in vhost '/' in exclusive use",
                channel.number,
                60,
                20,
            )
        consumer = AmqpConsumer(channel, tag, name, bool(method.no_ack))
        channel.consumers[tag] = consumer
        if method.exclusive:
            self.server.exclusive_consumers[name] = consumer
        prefetch = UNLIMITED if method.no_ack or not channel.prefetch else channel.prefetch
        if not method.nowait:
            self.send(encode_method(channel.number, commands.Basic.ConsumeOk(consumer_tag=tag)))
        consumer.sub = self.manager.subscribe(name, tag, consumer, prefetch, dispatch=False)
        self.to_refill().add(name)

    def b_cancel(self, channel: Channel, method: commands.Basic.Cancel) -> None:
        tag = text(method.consumer_tag)
        consumer = channel.consumers.pop(tag, None)
        if consumer is not None:
            self.server.consumer_ended(consumer)
            if consumer.sub is not None:
                # Unacknowledged deliveries stay with the channel until acked or it ends.
                self.manager.detach(consumer.sub)
            self.server.consumer_gone(consumer.queue)
        if not method.nowait:
            self.send(encode_method(channel.number, commands.Basic.CancelOk(consumer_tag=tag)))

    def consumer_cancelled(self, channel: Channel, tag: str) -> None:
        if self.capabilities.get("consumer_cancel_notify") and not channel.closing:
            self.send(encode_method(channel.number, commands.Basic.Cancel(consumer_tag=tag)))

    def b_publish(self, channel: Channel, method: commands.Basic.Publish) -> None:
        exchange = text(method.exchange)
        if exchange:
            found = self._exchanges().get(exchange)
            if found is None:
                raise AmqpError(
                    ReplyCode.NOT_FOUND,
                    f"NOT_FOUND - no exchange '{exchange}' in vhost '/'",
                    channel.number,
                    60,
                    40,
                )
            if found.internal:
                raise AmqpError(
                    ReplyCode.ACCESS_REFUSED,
                    f"ACCESS_REFUSED - cannot publish to internal exchange '{exchange}'",
                    channel.number,
                    60,
                    40,
                )
        channel.pending = Pending(exchange, text(method.routing_key), bool(method.mandatory))

    def _publish(self, channel: Channel) -> None:
        pending = channel.pending
        assert pending is not None
        channel.pending = None
        channel.fire(Event.CONTENT_DONE)
        self._published = True
        self.server.stats.messages_received += 1
        chunks = pending.chunks
        # One copy of the body: the join of its frames (views of the reads they came in).
        first = chunks[0] if len(chunks) == 1 else None
        if type(first) is bytes:
            self._publish_body(channel, pending, first)
        elif BIG_FROM and pending.received >= BIG_FROM:
            # A big body (64 MiB: ~50 ms) is joined in a worker thread with the GIL released,
            # so the other connections are served meanwhile; this one's later frames wait for
            # it as for a login's verdict (reading paused, held in order: login_decided).
            size = pending.received
            self.awaiting_login = True
            self.link.pause_reading()
            self.link.offload(
                lambda: join_range(chunks, 0, size),
                lambda body: self.login_decided(lambda: self._publish_body(channel, pending, body)),
            )
        else:
            self._publish_body(channel, pending, b"".join(chunks))

    def _publish_body(self, channel: Channel, pending: Pending, body: bytes) -> None:
        seq = 0
        if channel.confirm:
            channel.publish_seq += 1
            seq = channel.publish_seq
        exchange, key, mandatory, props = (
            pending.exchange,
            pending.routing_key,
            pending.mandatory,
            pending.properties,
        )
        if channel.tx is not None:
            channel.tx.append(
                lambda: self._route(channel, exchange, key, mandatory, props, body, 0)
            )
            return
        self._route(channel, exchange, key, mandatory, props, body, seq)

    def _plain_exchange(self, name: str) -> bool:
        """The exchange exists and clients may publish to it (b_publish says why not)."""
        found = self._exchanges().get(name)
        return found is not None and not found.internal

    def _route(
        self,
        channel: Channel,
        exchange: str,
        routing_key: str,
        mandatory: bool,
        properties: bytes,
        body: bytes,
        seq: int,
    ) -> None:
        reached, refused, durable = self.server.publish(exchange, routing_key, properties, body)
        if not reached and mandatory and not refused:
            self.send(
                encode_return(
                    channel.number,
                    ReplyCode.NO_ROUTE,
                    b"NO_ROUTE",
                    exchange.encode(),
                    routing_key.encode(),
                    properties,
                    body,
                    self.frame_max,
                )
            )
        if not seq:
            return
        if refused:
            self.send(encode_nack(channel.number, seq, False))
        elif durable and self.manager.persistence is not None:
            self._await_durable(channel, seq)
        else:
            self._confirms.setdefault(channel, []).append(seq)

    def _await_durable(self, channel: Channel, seq: int) -> None:
        durable = self._durable
        if durable is None:
            persistence = self.manager.persistence
            assert persistence is not None
            durable = self._durable = DurableReplies(persistence, self._durable_done)
        durable.add((channel, seq))

    def _durable_done(self, batch: list[tuple[Channel, int]], err: Exception | None) -> None:
        if self.state is not State.OPEN:
            return
        by_channel: dict[Channel, list[int]] = {}
        for channel, seq in batch:
            if channel.closing or self.channels.get(channel.number) is not channel:
                continue
            by_channel.setdefault(channel, []).append(seq)
        for channel, seqs in by_channel.items():
            if err is None:
                self._send_confirms(channel, seqs)
            else:
                self.send(b"".join(encode_nack(channel.number, s, False) for s in seqs))

    def b_get(self, channel: Channel, method: commands.Basic.Get) -> None:
        name = self._queue_name(channel, text(method.queue))
        self._check_exclusive(channel, name, 60, 70)
        queue = self._existing_queue(channel, name, 60, 70)
        entry = channel.getters.get(name)
        if entry is None or entry[0].queue.deleted:
            getter = _Getter()
            sub = self.manager.subscribe(
                name, f"get-{channel.number}", getter, UNLIMITED, dispatch=False
            )
            entry = channel.getters[name] = (sub, getter)
        sub, getter = entry
        self.server.touch(name)
        msg = self.manager.take(sub)
        if msg is None:
            self.send(encode_method(channel.number, commands.Basic.GetEmpty()))
            return
        tag = channel.next_tag
        channel.next_tag += 1
        if method.no_ack:
            self.manager.ack(sub, msg.id, dispatch=False)
        else:
            channel.unacked[tag] = (sub, msg.id)
        properties, body, exchange, routing_key = self.server.mapper.for_delivery(
            msg.payload,
            msg.headers,
            name,
            max(1, msg.expires_at - self.manager.clock()) if msg.expires_at else 0,
        )
        self.server.stats.messages_sent += 1
        encoder = channel.get_ok
        if encoder is None:
            encoder = channel.get_ok = GetOkEncoder(channel.number, self.frame_max)
        # (a body over one frame is written as views between its frame headers: no copy)
        self.link.send_parts(
            encoder.parts(
                tag,
                msg.attempts > 1,
                exchange,
                routing_key,
                queue.message_count,
                properties,
                body,
            )
        )

    def b_ack(self, channel: Channel, method: Any) -> None:
        tag, multiple = method.delivery_tag, bool(method.multiple)
        if channel.tx is not None:
            channel._tags_for(tag, multiple)  # unknown tags fail now, not at commit
            channel.tx.append(lambda: self.to_refill().update(channel.ack(tag, multiple)))
            return
        refill = self._refill  # (inline: the ack is the hot path)
        if isinstance(refill, set):
            refill |= channel.ack(tag, multiple)
        else:
            self._refill = channel.ack(tag, multiple)

    def b_nack(self, channel: Channel, method: Any) -> None:
        tag, multiple, requeue = method.delivery_tag, bool(method.multiple), bool(method.requeue)
        if channel.tx is not None:
            channel._tags_for(tag, multiple)
            channel.tx.append(lambda: self.to_refill().update(channel.nack(tag, multiple, requeue)))
            return
        self.to_refill().update(channel.nack(tag, multiple, requeue))

    def b_reject(self, channel: Channel, method: Any) -> None:
        tag, requeue = method.delivery_tag, bool(method.requeue)
        if channel.tx is not None:
            channel._tags_for(tag, False)
            channel.tx.append(lambda: self.to_refill().update(channel.nack(tag, False, requeue)))
            return
        self.to_refill().update(channel.nack(tag, False, requeue))

    def b_recover(self, channel: Channel, method: Any) -> None:
        self.to_refill().update(channel.recover())
        if isinstance(method, commands.Basic.Recover):
            self.send(encode_method(channel.number, commands.Basic.RecoverOk()))

    # confirms and transactions

    def c_select(self, channel: Channel, method: commands.Confirm.Select) -> None:
        if channel.tx is not None:
            raise AmqpError(
                ReplyCode.PRECONDITION_FAILED,
                "PRECONDITION_FAILED - cannot switch from tx to confirm mode",
                channel.number,
                85,
                10,
            )
        channel.confirm = True
        if not method.nowait:
            self.send(encode_method(channel.number, commands.Confirm.SelectOk()))

    def tx_select(self, channel: Channel, method: commands.Tx.Select) -> None:
        if channel.confirm:
            raise AmqpError(
                ReplyCode.PRECONDITION_FAILED,
                "PRECONDITION_FAILED - cannot switch from confirm to tx mode",
                channel.number,
                90,
                10,
            )
        if channel.tx is None:
            channel.tx = []
        self.send(encode_method(channel.number, commands.Tx.SelectOk()))

    def tx_commit(self, channel: Channel, method: commands.Tx.Commit) -> None:
        if channel.tx is None:
            raise AmqpError(
                ReplyCode.PRECONDITION_FAILED,
                "PRECONDITION_FAILED - channel is not transactional",
                channel.number,
                90,
                20,
            )
        work, channel.tx = channel.tx, []
        for step in work:
            step()
        self.send(encode_method(channel.number, commands.Tx.CommitOk()))

    def tx_rollback(self, channel: Channel, method: commands.Tx.Rollback) -> None:
        if channel.tx is None:
            raise AmqpError(
                ReplyCode.PRECONDITION_FAILED,
                "PRECONDITION_FAILED - channel is not transactional",
                channel.number,
                90,
                30,
            )
        channel.tx = []
        self.send(encode_method(channel.number, commands.Tx.RollbackOk()))
