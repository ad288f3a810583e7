"""Spark data pipeline over the journal and the broker (the ``spark`` extra).

``spark.read.format("vibemq").load(data_dir)`` and friends need the data source registered
once per session::

    from vibemq_server.spark import register
    register(spark)

Everything pyspark-related is imported lazily, so the pure-Python parts (segment reader,
offsets, report rendering) work without pyspark installed. See ``docs/spark.md``.
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Register the ``vibemq`` data source with a SparkSession, and turn on the Python data
    source filter pushdown it implements (Spark refuses a reader with ``pushFilters`` while
    ``spark.sql.python.filterPushdown.enabled`` is off). When the JVM reader's jar is built
    it is added to the session too: ``format("vibemq.jvm")`` (:mod:`.jvm`)."""
    from vibemq_server.spark import jvm
    from vibemq_server.spark.datasource import VibeMQDataSource

    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(VibeMQDataSource)
    jvm.add_to_session(spark)


__all__ = ["register"]
