"""The MQTT parser alone on a stream of 64 KiB QoS 1 PUBLISHes cut into reads of a given
size (issue 16: a read of 256,000 bytes, uvloop's, holds about four of them, one cut):
microseconds of ``MqttParser.feed`` per PUBLISH, best of 7.

    PYTHONPATH=$PWD .venv/bin/python -m bench.mqtt_feed_micro [label]
"""

from __future__ import annotations

import sys
import time

from vibemq_server.adapters.mqtt.codec import MqttParser, encode
from vibemq_server.adapters.mqtt.packets import Publish

COUNT = 400
READS = (256_000, 65_536, 200_000)


def per_publish(stream: bytes, read: int) -> float:
    """Best of 7 feeds of ``stream`` in reads of ``read`` bytes: seconds per PUBLISH."""
    chunks = [stream[at : at + read] for at in range(0, len(stream), read)]
    best = float("inf")
    for _ in range(7):
        parser = MqttParser(1 << 26)
        started = time.perf_counter()
        got = 0
        for chunk in chunks:
            got += len(parser.feed(chunk))
        best = min(best, time.perf_counter() - started)
        if got != COUNT:
            raise SystemExit(f"decoded {got} of {COUNT}")
    return best / COUNT


def main() -> None:
    label = sys.argv[1] if len(sys.argv) > 1 else "this checkout"
    payload = b"x" * 65_536
    stream = b"".join(
        encode(Publish("t/64k", payload, 1, packet_id=i % 65_535 + 1)) for i in range(COUNT)
    )
    for read in READS:
        print(f"{label}: reads of {read:,} bytes: {per_publish(stream, read) * 1e6:.1f} us/PUBLISH")


if __name__ == "__main__":
    main()
