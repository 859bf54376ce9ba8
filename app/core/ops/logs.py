"""Logging, configured in one place: JSON lines for machines, readable lines on a terminal.

``logging_config(settings)`` is the dict the CLI applies before anything else runs and hands to
uvicorn as ``log_config`` (so every worker process gets the same). Every record carries the
request id of the request being served (or ``-`` outside requests). uvicorn's own access log is
off; ``app.access`` writes one line per request instead (see ``app.core.ops.telemetry``).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, UTC
from typing import Any

from app.core.http.requestid import current_request_id

# Attributes every LogRecord has; anything else on a record was passed through ``extra=``.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message", "asctime", "color_message", "request_id", "taskName",
}


class RequestIdFilter(logging.Filter):
    """Stamp the current request id on every record (``-`` outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "request_id", None):
            record.request_id = current_request_id() or "-"
        return True


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request_id, then the extras."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None) or current_request_id(),
        }
        entry.update(_extras(record))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``time LEVEL logger [request id] message key=value ...`` for people at a terminal."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s [%(request_id)s] %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = _extras(record)
        if extras and record.name != "app.access":
            line += " " + " ".join(f"{k}={v}" for k, v in extras.items())
        return line


def wants_json(log_format: str, stream: Any = None) -> bool:
    if log_format == "json":
        return True
    if log_format == "text":
        return False
    stream = stream if stream is not None else sys.stderr
    isatty = getattr(stream, "isatty", None)
    return not (callable(isatty) and isatty())


def logging_config(level: str = "info", log_format: str = "auto") -> dict[str, Any]:
    """The ``logging.config.dictConfig`` dict for the whole process (and uvicorn's workers)."""
    formatter = "json" if wants_json(log_format) else "text"
    level = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"request_id": {"()": "app.core.ops.logs.RequestIdFilter"}},
        "formatters": {
            "json": {"()": "app.core.ops.logs.JsonFormatter"},
            "text": {"()": "app.core.ops.logs.TextFormatter"},
        },
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
                "formatter": formatter,
                "filters": ["request_id"],
            }
        },
        "root": {"level": level, "handlers": ["stderr"]},
        "loggers": {
            # uvicorn's loggers go through the same handler; its access log is replaced by ours.
            "uvicorn": {"level": level, "handlers": [], "propagate": True},
            "uvicorn.error": {"level": level, "handlers": [], "propagate": True},
            "uvicorn.access": {"level": "WARNING", "handlers": [], "propagate": False},
            "alembic": {"level": "INFO" if level in ("DEBUG", "INFO") else level, "propagate": True},
            "alembic.runtime.plugins": {"level": "WARNING"},
            "sqlalchemy": {"level": "WARNING"},
        },
    }


def configure_logging(level: str = "info", log_format: str = "auto") -> dict[str, Any]:
    """Apply the configuration to this process and return it (for uvicorn's ``log_config``)."""
    import logging.config

    config = logging_config(level, log_format)
    logging.config.dictConfig(config)
    return config
