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


def register(spark: Any) -> str:
    """Make ``format("vibemq")`` available to a SparkSession; returns which source it is.

    The JVM source (:mod:`.jvm`: batch and stream reads, writes) when its jar is built or can
    be built (a JDK); else the Python source (:mod:`.datasource`), with one log line. The
    Python source is registered as ``vibemq.python`` either way (Spark refuses one name for
    a JVM source and a Python one), and Python data source filter pushdown is turned on (Spark
    refuses a reader with ``pushFilters`` while ``spark.sql.python.filterPushdown.enabled``
    is off)."""
    from vibemq_server.spark import jvm
    from vibemq_server.spark.datasource import PythonDataSource, VibeMQDataSource

    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(PythonDataSource)
    if jvm.add_to_session(spark):
        return "jvm"
    spark.dataSource.register(VibeMQDataSource)
    return "python"


__all__ = ["register"]
