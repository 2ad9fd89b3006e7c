"""``Supervisor``: asks a list of guardrails whether an agent may do something."""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from types import MappingProxyType
from typing import cast

from corral.guard._group import AgentGroup
from corral.guard._result import Guardrail, GuardrailResult, GuardrailWarning, Severity
from corral.kernel import InvalidArgumentError
from corral.kernel import _validate as v

logger = logging.getLogger("corral.guard.supervisor")

_CheckFn = Callable[
    [str, str, Mapping[str, object]], "GuardrailResult | Awaitable[GuardrailResult]"
]
_EMPTY_CONTEXT: Mapping[str, object] = MappingProxyType({})
_ALLOW = GuardrailResult.allow()
_WARNING = Severity.WARNING
_isawaitable = inspect.isawaitable


class Supervisor:
    """Answers "may this agent do this?" for an :class:`AgentGroup` through guardrails.

    It intercepts nothing: code asks :meth:`check_action` before it lets an agent act.
    Guardrail names are unique within a supervisor. Adding, removing and checking are safe
    from several threads and tasks at once; a check in flight keeps the guardrails it started
    with.
    """

    __slots__ = ("_entries", "_group", "_lock")

    def __init__(self, group: AgentGroup, guardrails: Iterable[Guardrail] = ()) -> None:
        v.instance_of("Supervisor", "group", group, AgentGroup)
        given: object = guardrails
        if isinstance(given, str | bytes) or not isinstance(given, Iterable):
            raise InvalidArgumentError(
                "Supervisor", "guardrails", "an iterable of guardrails", guardrails
            )
        self._group = group
        self._lock = threading.Lock()
        # (guardrail, name, bound check), replaced whole on change so checks read it lock-free.
        self._entries: tuple[tuple[Guardrail, str, _CheckFn], ...] = ()
        for guardrail in guardrails:
            self.add_guardrail(guardrail)

    @property
    def group(self) -> AgentGroup:
        return self._group

    @property
    def guardrails(self) -> list[Guardrail]:
        """A copy of the guardrails, in evaluation order."""
        return [entry[0] for entry in self._entries]

    def add_guardrail(self, guardrail: Guardrail) -> None:
        """Append ``guardrail`` to the evaluation order.

        Its ``name`` and ``check`` are read once, here. Raises ``InvalidArgumentError`` when
        it has no non-empty string ``name`` or no callable ``check``, or when a guardrail of
        the same name is already present.
        """
        where = "Supervisor.add_guardrail"
        name = getattr(guardrail, "name", None)
        v.non_empty_str(where, "guardrail.name", name)
        check = getattr(guardrail, "check", None)
        v.callable_(where, "guardrail.check", check)
        name = cast(str, name)
        check = cast(_CheckFn, check)
        with self._lock:
            if any(entry[1] == name for entry in self._entries):
                raise InvalidArgumentError(
                    where, "guardrail.name", "a name not already in this supervisor", name
                )
            self._entries = (*self._entries, (guardrail, name, check))

    def remove_guardrail(self, name: str) -> bool:
        """Remove every guardrail called ``name``; whether there was one.

        Names are unique (``add_guardrail`` refuses a second one), so this removes at most
        one. Removing an absent name does nothing.
        """
        v.non_empty_str("Supervisor.remove_guardrail", "name", name)
        with self._lock:
            kept = tuple(entry for entry in self._entries if entry[1] != name)
            removed = len(kept) != len(self._entries)
            self._entries = kept
        return removed

    async def check_action(
        self, agent_id: str, action: str, context: Mapping[str, object] | None = None
    ) -> GuardrailResult:
        """Whether ``agent_id`` may do ``action``; fits ``corral.kernel.ActionCheck``.

        - No guardrails: allowed.
        - Guardrails run in order; the first result that is not allowed is returned at once
          and later guardrails do not run.
        - A guardrail that raises, or answers something that is not a ``GuardrailResult``,
          blocks (fails closed) with reason ``"Guardrail error: <message>"``.
        - A warning is logged and evaluation goes on.
        - When all allow, the result is the last guardrail's.

        Every returned result carries in ``warnings`` each warning met before it was reached
        (its own included), so none is lost. ``agent_id`` need not be a group member: the
        answer is the guardrails'. ``context`` is handed to each guardrail as given (an
        empty read-only mapping when None). Raises ``InvalidArgumentError`` for an empty
        ``agent_id``, a non-string ``action`` or a ``context`` that is not a mapping.
        """
        if context is None:
            context = _EMPTY_CONTEXT
        if (
            type(agent_id) is not str
            or not agent_id
            or type(action) is not str
            or (type(context) is not dict and context is not _EMPTY_CONTEXT)
        ):
            _check_arguments(agent_id, action, context)
        result = _ALLOW
        warnings: list[GuardrailWarning] | None = None
        for _, name, check in self._entries:
            try:
                outcome: object = check(agent_id, action, context)
                if outcome is _ALLOW:
                    # The shared plain allow: nothing to await, log or collect.
                    result = _ALLOW
                    continue
                if type(outcome) is not GuardrailResult:
                    if _isawaitable(outcome):
                        outcome = await outcome
                    if not isinstance(outcome, GuardrailResult):
                        message = f"guardrail {name!r} answered {outcome!r}, not a GuardrailResult"
                        logger.error("agent %r, action %r blocked: %s", agent_id, action, message)
                        return _refuse(message, warnings)
            except Exception as exc:
                logger.exception(
                    "guardrail %r raised for agent %r, action %r", name, agent_id, action
                )
                return _refuse(str(exc) or type(exc).__name__, warnings)
            result = outcome
            if result.warnings:
                if warnings is None:
                    warnings = []
                warnings.extend(result.warnings)
            if not result.allowed:
                return _with_warnings(result, warnings) if warnings else result
            if result.severity is _WARNING:
                reason = result.reason or ""
                logger.warning(
                    "guardrail %r warns about agent %r, action %r: %s",
                    name,
                    agent_id,
                    action,
                    reason,
                )
                if warnings is None:
                    warnings = []
                warnings.append(GuardrailWarning(name, reason))
        if warnings:
            return _with_warnings(result, warnings)
        return result

    def __repr__(self) -> str:
        names = [entry[1] for entry in self._entries]
        return f"Supervisor(group={self._group.name!r}, guardrails={names!r})"


def _check_arguments(agent_id: object, action: object, context: object) -> None:
    where = "Supervisor.check_action"
    v.non_empty_str(where, "agent_id", agent_id)
    v.instance_of(where, "action", action, str)
    v.instance_of(where, "context", context, Mapping)


def _with_warnings(result: GuardrailResult, warnings: list[GuardrailWarning]) -> GuardrailResult:
    return GuardrailResult(result.allowed, result.reason, result.severity, tuple(warnings))


def _refuse(message: str, warnings: list[GuardrailWarning] | None) -> GuardrailResult:
    return GuardrailResult(
        False, f"Guardrail error: {message}", Severity.BLOCK, tuple(warnings or ())
    )
