"""Rules from JSON: a list given in a request, or the daemon-wide rules file."""

from __future__ import annotations

import json
import os
import stat
from typing import Any

import pydantic

from corral.daemon._errors import GuardrailsFileError, InvalidSpecError
from corral.daemon.guardrails._custom import check_custom
from corral.daemon.guardrails._rules import RULES, Rule, printable, rule_problems

MAX_FILE_BYTES = 1 << 20


def parse_rules(
    data: object, field: str = "guardrails", *, import_custom: bool = True
) -> tuple[Rule, ...]:
    """Validate ``data`` (a JSON list) into rules, in order.

    Raises ``InvalidSpecError`` listing every problem, each at a path like
    ``guardrails[2].match.regex`` under ``field``: a rule that is not an object, an unknown or
    missing field, an empty or over-long match, a regex that does not compile or would unroll
    too far, ``timeoutS``/``onTimeout`` on a verdict other than ``ask``, text no store can
    keep, more than ``MAX_RULES`` rules. With ``import_custom`` (the default) it then imports
    and makes every custom rule's guardrail (:func:`check_custom`), which runs their modules'
    code: pass False for rules from someone who may not run code in the daemon.
    """
    try:
        rules = RULES.validate_python(data)
    except pydantic.ValidationError as exc:
        raise InvalidSpecError(rule_problems(exc, field), what=field) from None
    if import_custom:
        check_custom(rules, field)
    return rules


def load_rules_file(path: str | os.PathLike[str]) -> tuple[Rule, ...]:
    """The daemon-wide rules of ``corral serve --guardrails FILE``.

    The file holds JSON (UTF-8, at most 1 MiB): a list of rules, or ``{"guardrails": [...]}``.
    Custom rules are imported and made (:func:`parse_rules`). Raises ``GuardrailsFileError``
    naming the file and every problem: missing, not a regular file, unreadable, too big, not
    UTF-8, not JSON, the wrong shape, or invalid rules (at ``guardrails[i]...``).
    """
    shown = os.fsdecode(path)
    try:
        return _load(shown)
    except InvalidSpecError as exc:
        raise GuardrailsFileError(shown, exc.problems) from None


def _load(path: str) -> tuple[Rule, ...]:
    def refuse(message: str, field: str = "(file)") -> InvalidSpecError:
        return InvalidSpecError([{"field": field, "message": message}])

    try:
        # Looked at before it is opened: opening a FIFO would wait for a writer.
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise refuse("is not a regular file")
        with open(path, "rb") as file:
            raw = file.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise refuse("does not exist") from None
    except PermissionError:
        raise refuse("cannot be read: permission denied") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise refuse(f"cannot be read: {reason}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise refuse(f"is larger than {MAX_FILE_BYTES} bytes")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise refuse(f"is not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise refuse(f"is not JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    except RecursionError:
        raise refuse("is not JSON this daemon reads: it nests too deeply") from None
    if isinstance(data, dict):
        unknown = [key for key in data if key != "guardrails"]
        if unknown:
            raise InvalidSpecError(
                [{"field": printable(str(key)), "message": "unknown field"} for key in unknown]
            )
        if "guardrails" not in data:
            raise refuse('must hold a list of rules, or {"guardrails": [...]}', "guardrails")
        data = data["guardrails"]
    elif not isinstance(data, list):
        raise refuse(
            f'must hold a list of rules, or {{"guardrails": [...]}}, not {type(data).__name__}'
        )
    return parse_rules(data, "guardrails")
