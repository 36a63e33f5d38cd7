"""Structured log lines of the hub (``crdtstore serve --log-format json``): one JSON object per
line, carrying the tenant, run and agent of the connection being served where known.

The hub binds them once per connection (:func:`bind`, a context variable: every task the
connection's handler starts inherits it, and connections never see each other's); a log call
may also pass them as ``extra={"tenant": ..., "run": ..., "agent": ...}``, which wins.
:class:`JsonFormatter` writes ``{"time", "level", "logger", "message", "tenant"?, "run"?,
"agent"?, "exception"?}``; :func:`configure` installs it (or the plain text format) on the
root logger.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from contextvars import ContextVar
from typing import Final, Literal

__all__ = ["FIELDS", "JsonFormatter", "bind", "configure"]

FIELDS: Final = ("tenant", "run", "agent")
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_CONTEXT: ContextVar[dict[str, str] | None] = ContextVar("sync_log_context", default=None)


def bind(**fields: str | None) -> None:
    """Add ``fields`` (tenant, run, agent; None: leave out) to the log context of the current
    task and of the tasks it starts from now on."""
    current = dict(_CONTEXT.get() or {})
    current.update({k: v for k, v in fields.items() if v is not None})
    _CONTEXT.set(current)


class JsonFormatter(logging.Formatter):
    """A log record as one line of JSON (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        context = _CONTEXT.get() or {}
        for name in FIELDS:
            value = getattr(record, name, None) or context.get(name)
            if value is not None:
                out[name] = str(value)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def configure(log_format: Literal["text", "json"] = "text", level: int = logging.INFO) -> None:
    """Log to stderr at ``level`` in ``log_format`` (replacing the root logger's handlers)."""
    handler = logging.StreamHandler(sys.stderr)
    formatter = JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
