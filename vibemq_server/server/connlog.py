"""A connection's logger, bound only when it logs something.

structlog's ``bind`` copies a context dict into a new bound logger: a few hundred bytes per
connection, kept for its whole life, although an idle connection logs nothing (the per-
connection lines are debug, off by default). ``ConnLog`` stands in for the bound logger: it
holds what the context is made of (the connection it describes, keys a session added with
``bind``) and builds the real bound logger the first time a line at an enabled level is
logged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, cast

import structlog
from structlog.typing import FilteringBoundLogger

#: the log levels (method names) a connection may log at
LEVELS = ("debug", "info", "warning", "warn", "error", "exception", "critical", "msg")


class Described(Protocol):
    """What a connection logger describes: the connection's own context (conn_id, peer...)."""

    def log_context(self) -> Mapping[str, object]: ...


class Extra(Protocol):
    """A session that adds to its connection's context (client id, user), asked only when
    a line is logged (``bind_lazily``)."""

    def log_extra(self) -> Mapping[str, object]: ...


#: (wrapper class, level) -> whether it logs: asked by every connection's debug lines (three
#: per connection, all off by default), the configuration changes seldom
_ENABLED: dict[tuple[object, str], bool] = {}


def _enabled(level: str) -> bool:
    """Whether the configured wrapper class logs at ``level`` at all (structlog's filtering
    bound loggers turn the methods of the levels below theirs into ``_nop``)."""
    wrapper = structlog.get_config()["wrapper_class"]
    key = (wrapper, level)
    known = _ENABLED.get(key)
    if known is None:
        method = getattr(wrapper, level, None)
        known = method is None or getattr(method, "__name__", "") != "_nop"
        if len(_ENABLED) >= 64:
            _ENABLED.clear()
        _ENABLED[key] = known
    return known


class ConnLog:
    """Stands in for ``base.bind(**owner.log_context(), **extra)`` until a line is logged."""

    __slots__ = ("_base", "_bound", "_extra", "_owner")

    def __init__(
        self,
        base: FilteringBoundLogger,
        owner: Described,
        extra: Mapping[str, object] | Extra | None = None,
    ) -> None:
        """``extra``: keys added to the owner's context, or the session that says them."""
        self._base = base
        self._owner = owner
        self._extra = extra
        self._bound: FilteringBoundLogger | None = None

    def bound(self) -> FilteringBoundLogger:
        """The real bound logger (made now if it was not yet)."""
        bound = self._bound
        if bound is None:
            context = dict(self._owner.log_context())
            extra = self._extra
            if extra is not None:
                context.update(extra if isinstance(extra, Mapping) else extra.log_extra())
            bound = self._bound = self._base.bind(**context)
        return bound

    def bind(self, **extra: object) -> FilteringBoundLogger:
        """A logger with ``extra`` added to the context, still bound lazily."""
        before = self._extra
        if before is not None and not isinstance(before, Mapping):
            before = before.log_extra()
        merged = {**before, **extra} if before else extra
        return as_logger(ConnLog(self._base, self._owner, merged))

    def _emit(self, level: str, event: str | None, args: tuple[Any, ...], kw: Any) -> Any:
        if self._bound is None and not _enabled(level):
            return None
        method: Callable[..., Any] = getattr(self.bound(), level)
        return method(event, *args, **kw)

    def debug(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        return self._emit("debug", event, args, kw)

    def info(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        return self._emit("info", event, args, kw)

    def warning(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        return self._emit("warning", event, args, kw)

    warn = warning

    def error(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        return self._emit("error", event, args, kw)

    def exception(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        return self._emit("exception", event, args, kw)

    def critical(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        return self._emit("critical", event, args, kw)

    def __getattr__(self, name: str) -> Any:
        # anything else a bound logger has (new, unbind, the async methods...)
        return getattr(self.bound(), name)


def bind_lazily(log: FilteringBoundLogger, source: Extra) -> FilteringBoundLogger:
    """``log`` with ``source.log_extra()`` added to its context: asked when a line is
    logged, so nothing is kept per connection meanwhile (a plain structlog logger, as in a
    test's link, is bound now)."""
    if isinstance(log, ConnLog):
        return as_logger(ConnLog(log._base, log._owner, source))
    return log.bind(**source.log_extra())


def as_logger(log: ConnLog) -> FilteringBoundLogger:
    """``log`` typed as what it stands in for (it has the methods the broker calls)."""
    return cast(FilteringBoundLogger, log)
