"""Logging for the daemon: human-readable text or one JSON object a line.

Records logged while a gRPC call is served carry that call's request ID (the
caller's ``x-request-id`` metadata, when it sent one) as ``request_id``: a
field of its own in JSON, appended as ``[request_id=...]`` in text. With
tracing on, records logged while a span is current carry its ``trace_id``
and ``span_id`` (hex, as trace backends show them) the same way.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from datetime import UTC, datetime
from typing import TextIO

from stratad import tracing

TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"

#: The request ID of the call being served; set by the request interceptor.
current_request_id: contextvars.ContextVar[str] = contextvars.ContextVar(
    "stratad_request_id", default=""
)

# Attributes every LogRecord has; anything else was passed with `extra=` and
# belongs in the JSON object as a field of its own.
_STANDARD_ATTRS = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """Format a record as one JSON object: time, level, logger, message, extras."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRS:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class RequestIdFilter(logging.Filter):
    """Give records logged during a call that call's ``request_id`` (unless they have one),
    and, while a span is current, its ``trace_id`` and ``span_id``."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            request_id = current_request_id.get()
            if request_id:
                record.request_id = request_id
        ids = tracing.current_ids()  # None at once when tracing is off
        if ids is not None and not hasattr(record, "trace_id"):
            record.trace_id, record.span_id = ids
        return True


class TextFormatter(logging.Formatter):
    """`TEXT_FORMAT`, plus ``[request_id=...]`` on records that have one."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        text = super().formatMessage(record)
        request_id = getattr(record, "request_id", "")
        if request_id and "request_id=" not in record.getMessage():
            text += f" [request_id={request_id}]"
        trace_id = getattr(record, "trace_id", "")
        if trace_id:
            text += f" [trace_id={trace_id}]"
        return text


def setup_logging(level: str, fmt: str, stream: TextIO | None = None) -> None:
    """Send every log record at ``level`` or above to ``stream`` (stderr) as ``fmt``."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    # Replace rather than add, so that calling this twice does not double every line.
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


__all__ = [
    "JsonFormatter",
    "RequestIdFilter",
    "TextFormatter",
    "current_request_id",
    "setup_logging",
]
