"""A connection's logger is bound only when a line at an enabled level is logged
(server/connlog.py): an idle connection keeps no bound logger or context dict."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import pytest
import structlog
from structlog.testing import capture_logs

from vibemq_server.logs import configure_logging
from vibemq_server.server.connlog import ConnLog, as_logger, bind_lazily


class Conn:
    def __init__(self) -> None:
        self.asked = 0

    def log_context(self) -> Mapping[str, object]:
        self.asked += 1
        return {"conn_id": "c1", "peer": "127.0.0.1:5"}


class Client:
    def log_extra(self) -> Mapping[str, object]:
        return {"client_id": "dev-1", "user": "alice"}


@pytest.fixture(autouse=True)
def warning_level() -> Iterator[None]:
    saved = structlog.get_config()
    configure_logging("warning")
    yield
    structlog.configure(**saved)


def test_nothing_is_bound_until_a_line_at_an_enabled_level() -> None:
    conn = Conn()
    log = ConnLog(structlog.get_logger("t"), conn)
    log.debug("not logged")
    log.info("not logged either")
    assert conn.asked == 0 and log._bound is None
    with capture_logs() as logs:
        log.warning("logged", n=1)
    assert conn.asked == 1
    assert logs == [
        {"event": "logged", "n": 1, "conn_id": "c1", "peer": "127.0.0.1:5", "log_level": "warning"}
    ]


def test_a_session_adds_its_context_lazily() -> None:
    conn = Conn()
    log = bind_lazily(as_logger(ConnLog(structlog.get_logger("t"), conn)), Client())
    log.debug("not logged")
    assert conn.asked == 0
    with capture_logs() as logs:
        log.bind(extra=2).error("failed")
    assert logs[0]["client_id"] == "dev-1" and logs[0]["user"] == "alice"
    assert logs[0]["conn_id"] == "c1" and logs[0]["extra"] == 2
