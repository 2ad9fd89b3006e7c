"""The daemon's log lines as JSON (``corral serve --log-format json``): one object a line."""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime
from typing import Any

# What every LogRecord has: anything else on a record came from ``extra=`` and is shown.
_STANDARD = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys() | {"message", "asctime"}
)
# The daemon's lines about one agent start "agent <id>:" (its id is the first argument).
_ABOUT_AGENT = re.compile(r"agent %[sr]\b")


class JsonFormatter(logging.Formatter):
    """Formats a record as one line of JSON: ``time`` (ISO 8601, UTC, milliseconds),
    ``level``, ``logger``, ``message``; ``agentId`` when the line is about one agent (an
    ``agent_id`` given with ``extra=``, or the id of a line that starts ``agent %s``); any
    other ``extra=`` field by its name; ``exception`` (the traceback) when there is one.
    Values JSON cannot hold are written as their ``repr``; no line ever holds a raw newline.
    """

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        agent = getattr(record, "agent_id", None)
        if agent is None and isinstance(record.msg, str) and _ABOUT_AGENT.match(record.msg):
            args = record.args
            if isinstance(args, tuple) and args:
                agent = args[0]
        if agent is not None:
            line["agentId"] = str(agent)
        for key, value in vars(record).items():
            if key not in _STANDARD and key != "agent_id" and key not in line:
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=repr)
