"""A turn's page, made readable: its record as facts, its output as text, its log as lines,
each marked with its stream. What an agent wrote is shown with its control characters as
escapes (an ANSI colour code shows as ``\\x1b[31m``, never acts), then escaped as HTML by the
template; what is rendered is bounded (a daemon may keep far larger logs than a page should
hold: ``corral logs AGENT --turn N`` prints them all)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final

from corral.daemon._text import visible
from corral.daemon._turn_log import STREAMS, lines_of

Json = dict[str, Any]

OUTPUT_SHOWN: Final = 1_000_000
"""Characters of a turn's output on its page (the default cap keeps at most 1 MiB)."""
LOG_LINES_SHOWN: Final = 5_000
LOG_CHARS_SHOWN: Final = 1_000_000
"""A turn's page shows its log's first lines up to either bound."""
PROMPT_SHOWN: Final = 4_096


def view(record: Json) -> Json:
    """What ``turn.html`` shows of ``record`` (a turn with ``output`` and ``logs``)."""
    output = record.get("output")
    output_text = "" if output is None else str(output)
    lines, total = _lines(record.get("logs") or [])
    usage = record.get("usage") if isinstance(record.get("usage"), dict) else None
    prompt = str(record.get("prompt") or "")
    return {
        "outcome": str(record.get("outcome") or "running"),
        "startedAt": record.get("startedAt"),
        "endedAt": record.get("endedAt"),
        "duration": duration(record.get("startedAt"), record.get("endedAt")),
        "tokens": None if usage is None else usage.get("tokens"),
        "costUsd": None if usage is None else usage.get("costUsd"),
        "error": None if record.get("error") is None else visible(str(record["error"])[:20_000]),
        "prompt": visible(prompt[:PROMPT_SHOWN], lines=True),
        "promptChars": record.get("promptChars") or len(prompt),
        "flags": [f for f in ("retry", "restart", "woken") if record.get(f)],
        "output": None if output is None else visible(output_text[:OUTPUT_SHOWN], lines=True),
        "outputChars": len(output_text),
        "outputBytes": record.get("outputBytes"),
        "lines": lines,
        "linesTotal": total,
        "logBytes": record.get("logBytes") or 0,
        "droppedBytes": record.get("droppedBytes") or 0,
    }


def _lines(entries: list[Json]) -> tuple[list[Json], int]:
    """The log's first lines (within both bounds), each ``{"stream", "text"}`` with its text
    made visible, and how many lines the log has."""
    shown: list[Json] = []
    chars = 0
    total = 0
    for line in lines_of(e for e in entries if isinstance(e, dict)):
        total += 1
        if len(shown) >= LOG_LINES_SHOWN or chars >= LOG_CHARS_SHOWN:
            continue
        text = visible(line["text"][: LOG_CHARS_SHOWN - chars])
        chars += len(text)
        stream = line["stream"] if line["stream"] in STREAMS else "log"
        shown.append({"stream": stream, "text": text, "dropped": _is_marker(stream, text)})
    return shown, total


def _is_marker(stream: str, text: str) -> bool:
    """Whether the line is the daemon's note of what the log's cap dropped."""
    return stream == "corral" and "capped at" in text and "dropped" in text


def duration(started: Any, ended: Any) -> str | None:
    """How long from ``started`` to ``ended`` (ISO-8601 timestamps), as people read it."""
    if not isinstance(started, str) or not isinstance(ended, str):
        return None
    try:
        seconds = (datetime.fromisoformat(ended) - datetime.fromisoformat(started)).total_seconds()
    except (TypeError, ValueError):
        return None
    if seconds < 0:
        return None
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"
