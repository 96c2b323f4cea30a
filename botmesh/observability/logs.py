"""Logs: one set-up for every long-running process of botmesh (the worker and the gateway),
in text or in JSON lines, with the context of the record being handled.

``BOTMESH_LOG_FORMAT`` (or ``--log-format``) chooses the lines, on stderr:

- ``text`` (the default): ``2026-05-04 10:11:12,345 WARNING botmesh.runtime: message``;
- ``json``: one object a line, for a log pipeline::

    {"ts": "2026-05-04T10:11:12.345Z", "level": "WARNING", "logger": "botmesh.runtime",
     "message": "handler echo failed on m-1: ...", "chat_id": "42", "message_id": "m-1",
     "topic": "botmesh.inbound", "partition": 3, "offset": 1207,
     "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "span_id": "00f067aa0ba902b7"}

  ``ts`` is ISO 8601 in UTC; while a record is handled its context is added (``chat_id``,
  ``message_id``, ``topic``, ``partition``, ``offset``, ``idempotency_key`` for a send
  request), and ``trace_id`` / ``span_id`` when tracing is on (``tracing.py``); an
  exception comes as ``exc_type`` and ``exc`` (its traceback, as text).

librdkafka's own lines come out the same way: the clients hand them to Python's logging
(``botmesh.streams.librdkafka``, ``botmesh.streams.kafka``), never to stderr directly.
Python's warnings go through logging too under ``json``.

The context is a context variable set once a record (``record_scope``, entered by the
worker's runner around each record it settles, under ``json`` or with tracing on: under
``text`` lines untraced nothing reads it, and the runner sets none); the formatter reads it
only when a line is written, and nothing is copied before. ``log_context`` sets one anywhere.

Nothing a user wrote (an inbound's text, a send's text) and no credential is logged at
``info`` or above: message texts appear at ``debug`` at most.
"""

from __future__ import annotations

import json
import logging
import logging.config
import os
import time
from collections.abc import Mapping
from contextvars import ContextVar, Token
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from botmesh.observability import tracing
from botmesh.state.messages import DeliveryStatus
from botmesh.topics.records import SendRequest

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from botmesh.state.messages import Inbound
    from botmesh.topics.control import ControlRequest

__all__ = [
    "FIELDS",
    "FORMATS",
    "JsonFormatter",
    "LogContext",
    "current_context",
    "log_context",
    "log_format",
    "logging_config",
    "record_scope",
    "setup_logging",
]

#: The values of ``BOTMESH_LOG_FORMAT``.
FORMATS: Final = ("text", "json")
#: The ``text`` lines.
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: The context a JSON line carries while a record is handled, in this order.
FIELDS: Final = ("chat_id", "message_id", "topic", "partition", "offset", "idempotency_key")
_LEVELS: Final = ("debug", "info", "warning", "error", "critical")


def log_format(option: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The log format: ``option`` (``--log-format``), else ``BOTMESH_LOG_FORMAT``, else
    ``text``. ``ValueError`` naming where a value other than ``text`` or ``json`` came from."""
    env = os.environ if environ is None else environ
    where, raw = "--log-format", option
    if raw is None:
        where, raw = "BOTMESH_LOG_FORMAT", env.get("BOTMESH_LOG_FORMAT", "")
    value = raw.strip().lower() or "text"
    if value not in FORMATS:
        raise ValueError(f"{where}={raw!r}: must be one of {', '.join(FORMATS)}")
    return value


def _level(level: str | int) -> str | int:
    if isinstance(level, int):
        return level
    name = level.strip().upper()
    if name not in logging.getLevelNamesMapping():  # DEBUG ... CRITICAL, WARN, FATAL
        raise ValueError(
            f"log level {level!r} (--loglevel, BOTMESH_LOG_LEVEL): must be one of "
            f"{', '.join(_LEVELS)}"
        )
    return name


def logging_config(level: str | int = "info", fmt: str = "text") -> dict[str, Any]:
    """A new ``logging.config.dictConfig`` dictionary: one handler on stderr at ``level``,
    with the ``text`` or ``json`` lines (a new one each call: ``dictConfig`` consumes it)."""
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: must be one of {', '.join(FORMATS)}")
    formatter: dict[str, Any] = {"()": JsonFormatter} if fmt == "json" else {"format": TEXT_FORMAT}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"botmesh": formatter},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
                "formatter": "botmesh",
            }
        },
        "root": {"level": _level(level), "handlers": ["stderr"]},
    }


def setup_logging(level: str | int = "info", fmt: str = "text") -> None:
    """Set this process's logging up (the root logger's handler and level); under ``json``
    Python's warnings are logged too."""
    logging.config.dictConfig(logging_config(level, fmt))
    if fmt == "json":
        logging.captureWarnings(True)


# -- the context of the record being handled ------------------------------------------------


class LogContext:
    """What a JSON line says of the work under way (``log_context``): set once, read only
    when a line is written. Nested contexts add to the outer one (the inner value wins)."""

    __slots__ = ("_inner", "_outer", "_token", "_values")

    def __init__(
        self,
        values: Mapping[str, object] | None = None,
        inner: AbstractContextManager[object] | None = None,
    ) -> None:
        self._values = values
        #: Entered and left with this context (a record's span: ``record_scope``).
        self._inner = inner
        self._outer: LogContext | None = None
        self._token: Token[LogContext | None] | None = None

    def __enter__(self) -> LogContext:
        self._outer = _CONTEXT.get()
        self._token = _CONTEXT.set(self)
        if self._inner is not None:
            self._inner.__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self._inner is not None:
                self._inner.__exit__(kind, exc, tb)
        finally:
            if self._token is not None:
                _CONTEXT.reset(self._token)
                self._token = None

    def own(self) -> Mapping[str, object]:
        """This context's values (``None`` values unset)."""
        return self._values or {}

    def fields(self) -> dict[str, object]:
        """The context's values, the outer contexts' filling what this one leaves unset, in
        the order of ``FIELDS``."""
        out: dict[str, object] = {}
        ctx: LogContext | None = self
        while ctx is not None:
            for name, value in ctx.own().items():
                if value is not None and name not in out:
                    out[name] = value
            ctx = ctx._outer
        return {name: out[name] for name in FIELDS if name in out}


class _RecordContext(LogContext):
    """A record's context: the record and what it decoded to, read when a line is written
    (nothing is copied while no line is)."""

    __slots__ = ("_item", "_raw")

    def __init__(
        self,
        raw: tracing.ReadRecord,
        item: Inbound | SendRequest | ControlRequest | DeliveryStatus,
        inner: AbstractContextManager[object] | None,
    ) -> None:
        self._values = None  # LogContext.__init__'s, inline: it runs once a record
        self._inner = inner
        self._outer = None
        self._token = None
        self._raw = raw
        self._item = item

    def own(self) -> Mapping[str, object]:
        raw, item = self._raw, self._item
        return {
            "chat_id": item.chat_id,
            "message_id": item.message_id if isinstance(item, DeliveryStatus) else item.id,
            "topic": raw.topic,
            "partition": raw.partition,
            "offset": raw.offset,
            "idempotency_key": item.idempotency_key if isinstance(item, SendRequest) else None,
        }


_CONTEXT: ContextVar[LogContext | None] = ContextVar("botmesh_log_context", default=None)


def log_context(
    *,
    chat_id: str | None = None,
    message_id: str | None = None,
    topic: str | None = None,
    partition: int | None = None,
    offset: int | None = None,
    idempotency_key: str | None = None,
) -> LogContext:
    """``with log_context(chat_id=..., ...):`` the lines written inside carry these fields."""
    return LogContext(
        {
            "chat_id": chat_id,
            "message_id": message_id,
            "topic": topic,
            "partition": partition,
            "offset": offset,
            "idempotency_key": idempotency_key,
        }
    )


def current_context() -> dict[str, object]:
    """The fields of the context in force here (``{}`` outside any)."""
    ctx = _CONTEXT.get()
    return ctx.fields() if ctx is not None else {}


def record_scope(
    raw: tracing.ReadRecord, item: Inbound | SendRequest | ControlRequest | DeliveryStatus
) -> LogContext:
    """What the worker's runner settles each record inside
    (``botmesh.streams.runner.RecordScope``): its log context, and its span when tracing
    is on (``tracing.record_span``)."""
    return _RecordContext(raw, item, tracing.record_span(raw, item) if tracing.ENABLED else None)


# -- JSON lines -------------------------------------------------------------------------------


def _timestamp(created: float, msecs: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(msecs):03d}Z"


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ``ts``, ``level``, ``logger``, ``message``, the record's
    context (``log_context``; or the same names given as ``extra=``), ``trace_id`` and
    ``span_id`` when tracing is on, ``exc_type`` and ``exc`` for an exception."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": _timestamp(record.created, record.msecs),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        ctx = _CONTEXT.get()
        if ctx is not None:
            out.update(ctx.fields())
        given = record.__dict__
        for name in FIELDS:
            if name not in out and given.get(name) is not None:
                out[name] = given[name]
        if tracing.ENABLED:
            ids = tracing.current_ids()
            if ids is not None:
                out["trace_id"], out["span_id"] = ids
        info = record.exc_info
        if info and info[0] is not None:
            out["exc_type"] = info[0].__name__
            out["exc"] = record.exc_text or self.formatException(info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False, default=str)
