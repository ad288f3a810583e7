"""Metrics of a running broker for Prometheus (``exposition.render``); docs/monitoring.md."""

from vibemq_server.metrics.exposition import render

__all__ = ["render"]
