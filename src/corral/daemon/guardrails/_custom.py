"""Custom rules: Python guardrails named in a rule, imported and made inside the daemon."""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterable
from typing import Any

from corral.daemon._errors import InvalidSpecError
from corral.daemon.guardrails._rules import CustomRule, Rule
from corral.guard import Guardrail

_lock = threading.Lock()
# (path, options as canonical JSON) -> the instance, shared by every rule that names both.
_instances: dict[tuple[str, str], Guardrail] = {}


class GuardrailLoadError(Exception):
    """A custom rule's guardrail cannot be imported or made, or is not a guardrail."""


def instance(rule: CustomRule) -> Guardrail:
    """The guardrail ``rule`` names, made once per (path, options) and then reused.

    Imports ``package.module``, calls its ``Class(**options)`` and checks the result has a
    non-empty ``name`` and a callable ``check``. Raises :class:`GuardrailLoadError` saying
    which step failed; a failure is not cached (a later call tries again).
    """
    key = (rule.guardrail, rule.options_json)
    found = _instances.get(key)
    if found is not None:
        return found
    with _lock:  # one import and one instance per key, however many checks ask at once
        found = _instances.get(key)
        if found is None:
            found = _make(rule.guardrail, rule.options)
            _instances[key] = found
    return found


def _make(path: str, options: dict[str, Any]) -> Guardrail:
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # whatever the module's own code raises, too
        raise GuardrailLoadError(
            f"cannot import {module_name!r}: {type(exc).__name__}: {exc}"
        ) from exc
    factory = getattr(module, attribute, None)
    if factory is None:
        raise GuardrailLoadError(f"module {module_name!r} has no {attribute!r}")
    if not callable(factory):
        raise GuardrailLoadError(f"{path!r} is not a class or a function")
    try:
        made = factory(**options)
    except Exception as exc:
        raise GuardrailLoadError(f"{path}(**options) raised {type(exc).__name__}: {exc}") from exc
    name = getattr(made, "name", None)
    if (
        not isinstance(made, Guardrail)
        or not isinstance(name, str)
        or not name.strip()
        or not callable(getattr(made, "check", None))
    ):
        raise GuardrailLoadError(
            f"{path}(**options) made {type(made).__name__}, not a guardrail: it needs a "
            "non-empty string 'name' and a method 'check(agent_id, action, context)'"
        )
    return made


def check_custom(rules: Iterable[Rule], field: str = "guardrails") -> None:
    """Import and make the guardrail of every custom rule in ``rules`` (see :func:`instance`).

    Raises ``InvalidSpecError`` listing each rule that fails, at ``<field>[i].guardrail``.
    This runs the modules' code: call it only for rules the caller may put in the daemon.
    """
    problems = []
    for i, rule in enumerate(rules):
        if isinstance(rule, CustomRule):
            try:
                instance(rule)
            except GuardrailLoadError as exc:
                problems.append({"field": f"{field}[{i}].guardrail", "message": str(exc)})
    if problems:
        raise InvalidSpecError(problems, what=field)
