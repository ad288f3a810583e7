"""Protocol adapters (MQTT, AMQP 0-9-1, ZeroMQ) that translate their wire protocols into
commands of the protocol-free core in ``vibemq_server.core``. The native VibeMQ protocol lives
in ``vibemq_server.server``; each adapter here gets its own subpackage as it lands."""
