"""``corral serve --log-format json``: each log line one JSON object."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from corral.daemon._log_format import JsonFormatter
from corral.daemon._server import log_to_stderr
from corral.kernel import InvalidArgumentError


def formatted(record: logging.LogRecord) -> dict[str, object]:
    line = JsonFormatter().format(record)
    assert "\n" not in line
    parsed: dict[str, object] = json.loads(line)
    return parsed


def record(msg: str, *args: object, **extra: object) -> logging.LogRecord:
    made = logging.LogRecord("corral.daemon", logging.INFO, __file__, 1, msg, args, None)
    made.__dict__.update(extra)
    made.created = 1_900_000_000.25
    return made


def test_a_line_about_an_agent_names_it() -> None:
    line = formatted(record("agent %s: %s -> %s (%s)%s", "a_1", "running", "idle", None, ""))
    assert line == {
        "time": "2030-03-17T17:46:40.250+00:00",
        "level": "INFO",
        "logger": "corral.daemon",
        "message": "agent a_1: running -> idle (None)",
        "agentId": "a_1",
    }


def test_extra_fields_tracebacks_and_odd_values_are_kept() -> None:
    line = formatted(record("queried\nagain", agent_id="a_2", target="shop", odd={1, 2}))
    assert (line["agentId"], line["target"], line["odd"]) == ("a_2", "shop", "{1, 2}")
    assert line["message"] == "queried\nagain"  # escaped inside the one line
    try:
        raise ValueError("boom")
    except ValueError:
        failed = logging.LogRecord(
            "corral",
            logging.ERROR,
            __file__,
            1,
            "it failed",
            None,
            exc_info=sys.exc_info(),
        )
    line = formatted(failed)
    assert line["level"] == "ERROR"
    assert "ValueError: boom" in str(line["exception"])


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="text or json"):
        log_to_stderr(log_format="yaml")
