"""Instructions of the MQTT 3.1.1 and 5 parsers a QoS 1 message, for callgrind (issue 16, 64 KiB):
``pub``, 400 QoS 1 PUBLISHes of 64 KiB in reads of 256,000 bytes (about one in four cut over
two reads, as the broker reads them under ``bench.large_bench``); ``ack``, 4,000 PUBACKs in
reads of 64 bytes. MQTT 5 (``Mqtt5Parser.feed``, toggle
``CPyPy_codec5___Mqtt5Parser___feed``): ``pub5`` as ``pub``; ``small5``, 4,000 QoS 1
PUBLISHes of 200 bytes in reads of 1,500; ``ack5`` as ``ack``; ``qos2ack5``, 4,000 each of
PUBREC, PUBREL and PUBCOMP in reads of 64 bytes. Only the parser's ``feed`` is counted::

    PYTHONPATH=$PWD valgrind --tool=callgrind --callgrind-out-file=pub.out \\
        --toggle-collect='CPyPy_mqtt___codec___MqttParser___feed' \\
        .venv/bin/python -m bench.mqtt_parse_cost pub
    callgrind_annotate pub.out | grep -E 'PROGRAM TOTALS|__memcpy_avx_unaligned_erms \\['

(the compiled build's entry point; the payload's ``memcpy`` is counted apart, it is the same
in every build). Without callgrind it only checks that every packet comes out.
"""

from __future__ import annotations

import sys

from vibemq_server.adapters.mqtt.codec import MqttParser, encode
from vibemq_server.adapters.mqtt.codec5 import Mqtt5Parser, encode5
from vibemq_server.adapters.mqtt.packets import Puback, Publish
from vibemq_server.adapters.mqtt.packets5 import (
    Packet5,
    Puback5,
    Pubcomp5,
    Publish5,
    Pubrec5,
    Pubrel5,
)


def _v5(packets: list[Packet5], step: int) -> None:
    """Feed the MQTT 5 ``packets`` encoded, in reads of ``step`` bytes; check the count."""
    stream = b"".join(map(encode5, packets))
    parser = Mqtt5Parser(1 << 26)
    got = sum(len(parser.feed(stream[a : a + step])) for a in range(0, len(stream), step))
    if got != len(packets):
        raise SystemExit(f"decoded {got} of {len(packets)}")


def main() -> None:
    pid = [i % 65_535 + 1 for i in range(4000)]
    if sys.argv[1:] == ["pub5"]:
        return _v5(
            [Publish5("bench/large", b"x" * 65_536, 1, packet_id=i) for i in pid[:400]], 256_000
        )
    if sys.argv[1:] == ["small5"]:
        return _v5([Publish5("bench/small", b"x" * 200, 1, packet_id=i) for i in pid], 1500)
    if sys.argv[1:] == ["ack5"]:
        return _v5([Puback5(i) for i in pid], 64)
    if sys.argv[1:] == ["qos2ack5"]:
        return _v5([cls(i) for i in pid for cls in (Pubrec5, Pubrel5, Pubcomp5)], 64)
    if sys.argv[1:] == ["pub"]:
        payload = b"x" * 65_536
        stream = b"".join(
            encode(Publish("bench/large", payload, 1, packet_id=i % 65_535 + 1)) for i in range(400)
        )
        reads, count = [stream[a : a + 256_000] for a in range(0, len(stream), 256_000)], 400
    elif sys.argv[1:] == ["ack"]:
        acks = b"".join(encode(Puback(i % 65_535 + 1)) for i in range(4000))
        reads, count = [acks[a : a + 64] for a in range(0, len(acks), 64)], 4000
    else:
        raise SystemExit("usage: python -m bench.mqtt_parse_cost pub|ack|pub5|small5|ack5|qos2ack5")
    parser = MqttParser(1 << 26)
    got = sum(len(parser.feed(read)) for read in reads)
    if got != count:
        raise SystemExit(f"decoded {got} of {count}")


if __name__ == "__main__":
    main()
