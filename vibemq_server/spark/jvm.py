"""The JVM reader of the journal (``format("vibemq.jvm")``, DataSource V2; docs/spark.md).

Its jar, ``jars/vibemq-spark.jar`` beside this module, is built from ``java/`` by
``scripts/build_jar.sh`` (javac against pyspark's jars) at install or test time; it is not
committed. :func:`add_to_session` puts it on a running session's classpath (``ADD JAR``: the
driver's class loader, and shipped to executors); :func:`configure` sets ``spark.jars`` on a
session builder instead. Without the jar the Python source (``format("vibemq")``) remains.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

NAME = "vibemq.jvm"
SOURCE_CLASS = "io.vibemq.spark.JournalSource"
JAR = Path(__file__).resolve().parent / "jars" / "vibemq-spark.jar"


def jar_path() -> str | None:
    """The built jar, or None when it is not built (no JDK at install time)."""
    return str(JAR) if JAR.is_file() else None


def configure(builder: Any) -> Any:
    """A ``SparkSession.builder`` with the jar in ``spark.jars`` (when it is built)."""
    jar = jar_path()
    return builder if jar is None else builder.config("spark.jars", jar)


def loaded(spark: Any) -> bool:
    """Whether the session's driver can load the JVM source."""
    utils = spark.sparkContext._jvm.org.apache.spark.util.Utils
    return bool(utils.classIsLoadable(SOURCE_CLASS))


def add_to_session(spark: Any) -> bool:
    """Makes ``format("vibemq.jvm")`` available to the session: true when it is."""
    if loaded(spark):
        return True
    jar = jar_path()
    if jar is None:
        return False
    spark.sql(f"ADD JAR '{jar}'")
    return True
