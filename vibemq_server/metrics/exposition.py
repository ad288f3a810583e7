"""The Prometheus exposition of one broker: ``render(broker)`` -> (body, content type).

Built with the official client library, but no metric object of it is touched per message:
a custom collector reads, at scrape time, the plain counters the broker keeps anyway (each
queue's ``QueueStats``, the per-protocol ``ProtocolStats``, the authenticator's failures,
the journal's histograms, the manager's memory accounting) and yields metric families. The
process metrics come from the library's own collectors, in a registry of this broker's own
(never the global default registry, which a test process shares between brokers).

Cardinality is bounded (``metrics.per_queue_limit``): per-queue series only for the N
deepest queues, plus totals over every queue; docs/monitoring.md lists every metric.
"""

from __future__ import annotations

import contextlib
import heapq
import weakref
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_PLAIN_0_0_4,
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from vibemq_server.core.queue import Queue, QueueStats
from vibemq_server.journal.stats import FixedHistogram

if TYPE_CHECKING:
    from vibemq_server.server.broker import Broker

#: a Queue's (and QueueStats') counter field -> the metric name part and its help text
QUEUE_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("n_published", "published", "Messages published into the queue."),
    ("n_delivered", "delivered", "Deliveries to consumers, redeliveries included."),
    ("n_acked", "acked", "Deliveries acknowledged by consumers."),
    ("n_redelivered", "redelivered", "Deliveries of a message delivered before."),
    ("n_dead_lettered", "dead_lettered", "Messages moved to a dead-letter queue."),
    ("n_expired", "expired", "Messages whose TTL passed while they waited."),
    (
        "n_dropped",
        "dropped",
        "Messages lost: overflow (DropOldest, DropNewest), retries exhausted or expired "
        "without a dead-letter queue, purges.",
    ),
)

_INF = float("inf")


def _bucket_label(bound: float) -> str:
    return "+Inf" if bound == _INF else repr(float(bound))


def _histogram(name: str, doc: str, hist: FixedHistogram) -> HistogramMetricFamily:
    return HistogramMetricFamily(
        name,
        doc,
        buckets=[(_bucket_label(b), n) for b, n in hist.cumulative()],
        sum_value=hist.total,
    )


class BrokerCollector(Collector):
    """Every VibeMQ metric of one broker, read at scrape time."""

    def __init__(self, broker: Broker) -> None:
        self._broker = weakref.ref(broker)

    def collect(self) -> Iterable[Metric]:
        broker = self._broker()
        if broker is None:
            return []
        return list(self._collect(broker))

    def _collect(self, broker: Broker) -> Iterator[Metric]:
        yield from self._broker_info(broker)
        yield from self._queues(broker)
        yield from self._protocols(broker)
        yield from self._auth(broker)
        yield from self._journal(broker)
        yield from self._memory(broker)

    # -- the broker --------------------------------------------------------------------------

    @staticmethod
    def _broker_info(broker: Broker) -> Iterator[Metric]:
        stats = broker.stats
        info = GaugeMetricFamily(
            "vibemq_build_info", "The broker's version (always 1).", labels=["version"]
        )
        info.add_metric([stats.version], 1)
        yield info
        yield GaugeMetricFamily(
            "vibemq_start_time_seconds",
            "When the broker started, seconds since the Unix epoch.",
            value=stats.started_wall,
        )
        yield GaugeMetricFamily(
            "vibemq_uptime_seconds", "Seconds since the broker started.", value=stats.uptime_s
        )

    # -- queues ------------------------------------------------------------------------------

    @staticmethod
    def _queues(broker: Broker) -> Iterator[Metric]:
        manager = broker.manager
        queues = list(manager.queues.values())
        limit = broker.config.metrics.per_queue_limit
        if limit < 0 or limit >= len(queues):
            top = queues
        elif limit == 0:
            top = []
        else:
            top = heapq.nlargest(limit, queues, key=_depth)

        depth = GaugeMetricFamily(
            "vibemq_queue_messages", "Ready messages waiting in the queue.", labels=["queue"]
        )
        nbytes = GaugeMetricFamily(
            "vibemq_queue_messages_bytes",
            "Payload bytes of the queue's ready messages.",
            labels=["queue"],
        )
        unacked = GaugeMetricFamily(
            "vibemq_queue_messages_unacked",
            "Messages delivered and not yet acknowledged.",
            labels=["queue"],
        )
        consumers = GaugeMetricFamily(
            "vibemq_queue_consumers", "Subscriptions to the queue.", labels=["queue"]
        )
        counters = [
            CounterMetricFamily(f"vibemq_queue_messages_{part}", doc, labels=["queue"])
            for _, part, doc in QUEUE_COUNTERS
        ]
        for queue in top:
            name = [queue.name]
            depth.add_metric(name, queue.count)
            nbytes.add_metric(name, queue.nbytes)
            unacked.add_metric(name, queue.unacked_count)
            consumers.add_metric(name, len(queue.subscriptions))
            for family, (field, _, _) in zip(counters, QUEUE_COUNTERS, strict=True):
                family.add_metric(name, getattr(queue, field))
        yield depth
        yield nbytes
        yield unacked
        yield consumers
        yield from counters

        # Totals over every queue (deleted ones' counts included, so counters never fall).
        total = QueueStats()
        total.add(manager.retired_stats)
        ready = ready_bytes = in_flight = subscribed = 0
        for queue in queues:
            ready += queue.count
            ready_bytes += queue.nbytes
            subs = queue.subscriptions
            if subs:
                subscribed += len(subs)
                in_flight += queue.unacked_count
            total.add(queue)
        yield GaugeMetricFamily("vibemq_queues", "Queues that exist now.", value=len(queues))
        yield GaugeMetricFamily(
            "vibemq_queues_exported",
            "Queues with per-queue series in this scrape (metrics.per_queue_limit).",
            value=len(top),
        )
        yield GaugeMetricFamily(
            "vibemq_queues_messages", "Ready messages in all queues.", value=ready
        )
        yield GaugeMetricFamily(
            "vibemq_queues_messages_bytes",
            "Payload bytes of the ready messages of all queues.",
            value=ready_bytes,
        )
        yield GaugeMetricFamily(
            "vibemq_queues_messages_unacked",
            "Unacknowledged deliveries of all queues.",
            value=in_flight,
        )
        yield GaugeMetricFamily(
            "vibemq_queues_consumers", "Subscriptions to all queues.", value=subscribed
        )
        for field, part, doc in QUEUE_COUNTERS:
            yield CounterMetricFamily(
                f"vibemq_queues_messages_{part}",
                f"All queues, deleted ones included: {doc[0].lower()}{doc[1:]}",
                value=getattr(total, field),
            )

    # -- protocols ---------------------------------------------------------------------------

    @staticmethod
    def _protocols(broker: Broker) -> Iterator[Metric]:
        label = ["protocol"]
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            "connections": GaugeMetricFamily(
                "vibemq_connections", "Open client connections.", labels=label
            ),
            "connections_total": CounterMetricFamily(
                "vibemq_connections_opened", "Client connections accepted.", labels=label
            ),
            "bytes_received": CounterMetricFamily(
                "vibemq_received_bytes",
                "Protocol bytes read from clients (over TLS: decrypted).",
                labels=label,
            ),
            "bytes_sent": CounterMetricFamily(
                "vibemq_sent_bytes",
                "Protocol bytes written to clients (over TLS: before encryption).",
                labels=label,
            ),
            "messages_received": CounterMetricFamily(
                "vibemq_messages_received", "Messages published by clients.", labels=label
            ),
            "messages_sent": CounterMetricFamily(
                "vibemq_messages_sent", "Messages delivered to clients.", labels=label
            ),
            "messages_dropped": CounterMetricFamily(
                "vibemq_messages_dropped",
                "Messages a protocol dropped where no queue counts them (an MQTT clean "
                "session's backlog or QoS 0 backlog, a ZeroMQ PULL message refused).",
                labels=label,
            ),
        }
        errors = CounterMetricFamily(
            "vibemq_protocol_errors",
            "Error replies by the protocol's own code (native ErrorCode, MQTT violation "
            "kind, AMQP reply code).",
            labels=["protocol", "code"],
        )
        for name, stats in sorted(broker.stats.protocols.items()):
            for field, family in families.items():
                family.add_metric([name], getattr(stats, field))
            for code, count in sorted(stats.errors.items()):
                errors.add_metric([name, code], count)
        yield from families.values()
        yield errors

    @staticmethod
    def _auth(broker: Broker) -> Iterator[Metric]:
        failures = CounterMetricFamily(
            "vibemq_auth_failures",
            "Refused logins by protocol and reason.",
            labels=["protocol", "reason"],
        )
        for (protocol, reason), count in sorted(broker.auth.failures.items()):
            failures.add_metric([protocol, reason], count)
        yield failures

    # -- journal and memory ------------------------------------------------------------------

    @staticmethod
    def _journal(broker: Broker) -> Iterator[Metric]:
        journal = broker.journal
        disk = 0
        for seg in list(journal.segments.values()):
            with contextlib.suppress(OSError):  # reclaimed meanwhile
                disk += seg.path.stat().st_size
        yield CounterMetricFamily(
            "vibemq_journal_written_bytes",
            "Bytes written to the journal.",
            value=journal.bytes_written,
        )
        yield GaugeMetricFamily(
            "vibemq_journal_segments", "Journal segment files.", value=len(journal.segments)
        )
        yield GaugeMetricFamily(
            "vibemq_journal_disk_bytes", "Size of the journal's segment files.", value=disk
        )
        yield GaugeMetricFamily(
            "vibemq_journal_available",
            "1 while the journal can be written, 0 after a storage failure.",
            value=1 if journal.available else 0,
        )
        yield _histogram(
            "vibemq_journal_fsync_duration_seconds",
            "Time one fsync of the journal took.",
            journal.fsync_seconds,
        )
        yield _histogram(
            "vibemq_journal_commit_batch_size",
            "Acknowledgements released by one fsync (group commit; fsync = always).",
            journal.commit_batch,
        )
        yield GaugeMetricFamily(
            "vibemq_journal_recovery_seconds",
            "How long the journal's recovery took at start.",
            value=journal.recovery_seconds,
        )
        yield GaugeMetricFamily(
            "vibemq_journal_recovered_messages",
            "Messages the journal's recovery put back at start.",
            value=journal.recovered_messages,
        )

    @staticmethod
    def _memory(broker: Broker) -> Iterator[Metric]:
        manager = broker.manager
        yield GaugeMetricFamily(
            "vibemq_memory_queued_bytes",
            "Payload bytes of ready messages, the memory watermark's measure.",
            value=manager.memory_bytes,
        )
        yield GaugeMetricFamily(
            "vibemq_memory_high_watermark_bytes",
            "Over this, publishers are paused (memory_high_watermark_bytes).",
            value=manager.memory_high,
        )
        yield GaugeMetricFamily(
            "vibemq_memory_low_watermark_bytes",
            "Paused publishers resume under this.",
            value=manager.memory_low,
        )
        yield GaugeMetricFamily(
            "vibemq_memory_alarm",
            "1 while publishers are paused by the memory high watermark.",
            value=1 if manager.memory_blocked else 0,
        )


def _depth(queue: Queue) -> int:
    return queue.count


def registry_for(broker: Broker) -> CollectorRegistry:
    """A registry of this broker's own: its collector, the process, platform and GC ones."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(broker))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


_registries: weakref.WeakKeyDictionary[Broker, CollectorRegistry] = weakref.WeakKeyDictionary()


def render(broker: Broker) -> tuple[bytes, str]:
    """The scrape body (Prometheus text format 0.0.4) and its content type. Call it on the
    broker's event loop (it reads the broker's state without locks)."""
    registry = _registries.get(broker)
    if registry is None:
        registry = _registries[broker] = registry_for(broker)
    return generate_latest(registry), CONTENT_TYPE_PLAIN_0_0_4
