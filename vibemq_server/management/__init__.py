"""What the management API does, without HTTP: protocol-free, synchronous functions over a
running ``Broker`` that return pydantic models (JSON as they are).

``connections``: every client connection across protocols, its consumers, closing one with a
reason the client sees. ``definitions``: queues, exchanges, bindings and users as one JSON
document, exported and imported (RabbitMQ's definitions). ``exchanges``: AMQP exchanges and
bindings. ``mqtt``: MQTT sessions and retained messages. ``users``: users, tags and
permissions. ``errors``: the kinds of refusal (not found, invalid, conflict, ...) a caller
maps onto its own answers. Adapters are reached only through Protocols declared here.
"""
