"""Issue 16: a message over a protocol's size limit is refused with that protocol's own error and
nothing else on the connection or the broker is disturbed. AMQP here (a channel error 406, as
RabbitMQ); MQTT 3.1.1 (close) and MQTT 5 (DISCONNECT 0x95) are in test_mqtt_protocol.py and
test_mqtt5.py, the native protocol (Error INVALID_MESSAGE, close) in test_native_bad_input.py.
"""

from __future__ import annotations

from collections.abc import Callable

import pika
import pytest
from amqputil import AmqpBroker, Bystander, PikaClients, queue_counts, roundtrip_ok

LIMIT = 4096


@pytest.fixture
def small(brokers: Callable[..., AmqpBroker]) -> AmqpBroker:
    return brokers(amqp={"max_message_size": LIMIT})


@pytest.mark.parametrize("size", [LIMIT + 1, 10 * LIMIT, 300_000], ids=["by-1", "10x", "frames"])
def test_amqp_message_over_the_limit_is_channel_error_406_and_nothing_else(
    small: AmqpBroker, clients: PikaClients, size: int
) -> None:
    """``frames``: a body over frame_max, whose body frames keep coming after the refusal."""
    bystander = Bystander(clients.connect(small.amqp_port))
    conn = clients.connect(small.amqp_port)
    spare = conn.channel()
    spare.queue_declare("limits")
    channel = conn.channel()
    channel.queue_declare("limits")
    channel.basic_publish("", "limits", b"x" * LIMIT)  # at the limit: accepted
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.basic_publish("", "limits", b"y" * size)
        channel.basic_qos()  # a synchronous method: brings out the asynchronous error
    assert info.value.reply_code == 406
    assert info.value.reply_text == (
        f"PRECONDITION_FAILED - message size {size} is larger than configured max size {LIMIT}"
    )
    # The connection, its other channel and other connections carry on; the message at the
    # limit is stored, the refused one is not.
    assert conn.is_open and spare.is_open
    spare.basic_publish("", "limits", b"after")
    assert queue_counts(spare, "limits") == (2, 0)
    got = [spare.basic_get("limits", auto_ack=True)[2] for _ in range(2)]
    assert got == [b"x" * LIMIT, b"after"]
    roundtrip_ok(conn, "after-limit")
    bystander.assert_unaffected()
