"""The JVM data source, ``format("vibemq")`` when its jar loads (DataSource V2; docs/spark.md).

Its jar is built from ``java/`` against the jars pyspark ships (javac, no Maven, no network):
by ``scripts/build_jar.sh`` into ``jars/vibemq-spark.jar`` beside this module (CI, a source
checkout), or else, the first time it is needed, by :func:`jar_path` into a cache directory
(``$VIBEMQ_CACHE_DIR``, else ``$XDG_CACHE_HOME/vibemq`` or ``~/.cache/vibemq``), keyed by the
sources and pyspark's version: a ``pip install`` with a JDK gets it without a step of its own.
Without a JDK there is no jar; :func:`vibemq_server.spark.register` then registers the Python
source under ``vibemq`` (one log line says so). :func:`add_to_session` puts the jar on a
running session's classpath (``ADD JAR``); :func:`configure` sets ``spark.jars`` on a builder.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path
from typing import Any

log = logging.getLogger("vibemq.spark")

NAME = "vibemq"  # the JVM source's short name
ALIAS = "vibemq.jvm"  # the JVM source's first name, kept as an alias
PYTHON_NAME = "vibemq.python"  # the Python source, always registered under this name
SOURCE_CLASS = "io.vibemq.spark.JournalSource"
HERE = Path(__file__).resolve().parent
JAR = HERE / "jars" / "vibemq-spark.jar"
JAVA = HERE / "java"
BUILD_TIMEOUT_S = 300


def _sources() -> list[Path]:
    return sorted(p for p in JAVA.rglob("*") if p.is_file())


def _pyspark_jars() -> Path | None:
    try:
        import pyspark
    except ImportError:
        return None
    jars = Path(pyspark.__file__).resolve().parent / "jars"
    return jars if jars.is_dir() else None


def _javac() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "javac", os.X_OK):
        return str(Path(home) / "bin" / "javac")
    return shutil.which("javac")


def cache_dir() -> Path:
    root = os.environ.get("VIBEMQ_CACHE_DIR")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "vibemq"


def _cached_jar(jars: Path) -> Path:
    """Where the cache keeps the jar of these sources built against this pyspark."""
    digest = hashlib.sha256()
    for path in _sources():
        digest.update(str(path.relative_to(JAVA)).encode() + b"\0" + path.read_bytes())
    digest.update(str(sorted(p.name for p in jars.glob("spark-sql*.jar"))).encode())
    return cache_dir() / "spark-jar" / digest.hexdigest()[:16] / "vibemq-spark.jar"


def build(target: Path, javac: str, jars: Path) -> None:
    """Compile ``java/`` against pyspark's jars into the jar ``target`` (a zip of the
    classes and META-INF/services), atomically."""
    with tempfile.TemporaryDirectory(prefix="vibemq-jar-") as work:
        classes = Path(work) / "classes"
        sources = [str(p) for p in _sources() if p.suffix == ".java"]
        subprocess.run(
            [javac, "--release", "17", "-nowarn", "-encoding", "UTF-8", "-cp", f"{jars}/*",
             "-d", str(classes), *sources],
            check=True, capture_output=True, timeout=BUILD_TIMEOUT_S,
        )  # fmt: skip
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_suffix(f".{os.getpid()}.tmp")
        with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n\r\n")
            for path in sorted((JAVA / "META-INF").rglob("*")):
                if path.is_file():
                    jar.write(path, str(path.relative_to(JAVA)))
            for path in sorted(classes.rglob("*.class")):
                jar.write(path, str(path.relative_to(classes)))
        part.replace(target)


def jar_path() -> str | None:
    """The jar: the one built in place by scripts/build_jar.sh, else the cached build (made
    now if javac and pyspark's jars are there). None, with one log line, when there is none."""
    if JAR.is_file():
        return str(JAR)
    jars, javac = _pyspark_jars(), _javac()
    if jars is None or javac is None or not (JAVA / "META-INF").is_dir():
        log.warning("no JDK (javac) to build the JVM source: format(%r) is the Python source", NAME)
        return None
    target = _cached_jar(jars)
    if target.is_file():
        return str(target)
    try:
        build(target, javac, jars)
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        log.warning(
            "the JVM source did not build (%s %s): format(%r) is the Python source",
            exc, detail.decode(errors="replace")[-500:], NAME,
        )  # fmt: skip
        return None
    return str(target)


def configure(builder: Any) -> Any:
    """A ``SparkSession.builder`` with the jar in ``spark.jars`` (when there is one)."""
    jar = jar_path()
    return builder if jar is None else builder.config("spark.jars", jar)


def loaded(spark: Any) -> bool:
    """Whether the session's driver can load the JVM source."""
    utils = spark.sparkContext._jvm.org.apache.spark.util.Utils
    return bool(utils.classIsLoadable(SOURCE_CLASS))


def add_to_session(spark: Any) -> bool:
    """Makes the JVM source available to the session: true when it is."""
    if loaded(spark):
        return True
    jar = jar_path()
    if jar is None:
        return False
    spark.sql(f"ADD JAR '{jar}'")
    return loaded(spark)
