"""VibeMQ: a message broker speaking VibeMQ, with MQTT, AMQP 0-9-1 and ZeroMQ adapters."""

__version__ = "0.1.0"
