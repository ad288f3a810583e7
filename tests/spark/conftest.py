"""Spark fixtures: one session-scoped local SparkSession, and real broker processes.

The SparkSession is created only when a test asks for it (tests marked ``spark``); the pure
Python tests in this directory run without Java. A missing Java or pyspark fails the Spark
tests loudly instead of skipping them: CI must run them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration"))
from serverproc import clean_env, server_args


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail(
            "Java is missing: the Spark tests need a JRE 17 (apt install openjdk-17-jre-headless)"
        )
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:  # pragma: no cover - CI installs the spark extra
        pytest.fail(f"pyspark is missing ({exc}): pip install -e '.[spark,test]'")
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2]")
        .appName("vibemq-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.task.maxFailures", "2")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    from vibemq_server.spark import register

    register(session)
    yield session
    session.stop()


class BrokerProcess:
    """A real ``python -m vibemq_server`` on 127.0.0.1, port 0, with its data directory."""

    def __init__(self, data_dir: Path, *flags: str) -> None:
        self.data_dir = data_dir
        self.ready = data_dir.parent / f"{data_dir.name}.ready.json"
        self.ready.unlink(missing_ok=True)
        self.log = open(data_dir.parent / f"{data_dir.name}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            server_args(data_dir, self.ready, *flags),
            env=clean_env(),
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while not self.ready.exists() or not self.ready.read_text().strip():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"broker did not start, see {self.log.name}")
            time.sleep(0.05)
        self.port = int(json.loads(self.ready.read_text())["vibemq"])

    def stop(self) -> None:
        """SIGTERM and wait (the broker drains and closes its journal)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        with contextlib.suppress(Exception):
            self.log.close()


@pytest.fixture
def broker_proc(tmp_path: Path) -> Iterator[Any]:
    """A factory of broker processes, all stopped at the end of the test."""
    started: list[BrokerProcess] = []

    def start(data_dir: Path | None = None, *flags: str) -> BrokerProcess:
        proc = BrokerProcess(data_dir or tmp_path / f"data{len(started)}", *flags)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()


@pytest.fixture(scope="session")
def broker_journal(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """A journal written by a real broker run (see brokerwork.orders_workload), stopped."""
    import asyncio

    from brokerwork import orders_workload

    data = tmp_path_factory.mktemp("brokerjournal") / "data"
    proc = BrokerProcess(data)
    try:
        work = asyncio.run(orders_workload(proc.port))
    finally:
        proc.stop()
    return data, work
