"""Changing a live agent (``PATCH /agents/{id}``, ``corral set``): what may change, how a
change is checked, and the event that records it.

What may change while an agent lives (docs/daemon.md, "Changing a live agent"):

- ``budget``: the budget path as it was (``AgentService.change_budget``): dimensions given
  change, ``null`` lifts one, the others stay; ``agent.budget_changed``.
- ``notifyOn``: the kinds of notices its parent gets (replaced whole, as JSON merge patch
  replaces arrays; ``null`` is none).
- ``guardrails``: the agent's own rules (replaced whole; ``null`` is none). They apply to its
  next action check, and to its descendants' (which inherit them). The daemon-wide rules
  (``corral serve --guardrails``) are the daemon's configuration: not changed here.

Nothing else: a harness, command, prompt, env or parent change is a new agent.

A person's token changes all three. An agent's token may only tighten what is in its reach,
as it may only lower budgets: add ``notifyOn`` kinds (never remove one: that would hide an
outcome from its parent) and append ``block``, ``ask`` or ``warn`` match rules to the
guardrails (never remove, change or reorder a rule, nor add an ``allow`` rule, which ends a
check early, or a custom one, which runs Python in the daemon). Anything else is
``out_of_scope``. Every change is recorded with who and why, and whether it loosened
anything (``agent.spec_changed``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from corral.daemon._errors import InvalidRequestError, InvalidSpecError, OutOfScopeError
from corral.daemon._events import SPEC_CHANGED, NewEvent
from corral.daemon._spec import AgentSpec, parse_spec
from corral.daemon.guardrails import check_custom

SPEC_FIELDS = ("notifyOn", "guardrails")
"""The spec's fields a PATCH may change, beside ``budget`` (which has a path of its own)."""
FIELDS = ("budget", *SPEC_FIELDS)

TIGHTER_VERDICTS = frozenset({"block", "ask", "warn"})


def changed_spec(
    spec: AgentSpec, changes: Mapping[str, Any], *, agent_token: str | None
) -> tuple[AgentSpec, dict[str, Any]]:
    """``spec`` with ``changes`` (camelCase :data:`SPEC_FIELDS`, None for an empty list)
    applied, checked as a spawn checks a spec: the new spec and the changed fields as JSON
    (only those that differ: an unchanged field is left out).

    ``agent_token`` names the agent whose own token asks: it may only tighten
    (``OutOfScopeError`` otherwise). Raises ``InvalidRequestError`` listing every problem.
    """
    unknown = sorted(set(changes) - set(SPEC_FIELDS))
    if unknown:
        raise InvalidRequestError(
            [{"field": f, "message": "cannot be changed on a live agent"} for f in unknown],
            "patch",
        )
    old = spec.to_json()
    wanted = {k: [] if v is None else v for k, v in changes.items()}
    try:
        new = parse_spec({**old, **wanted})
    except InvalidSpecError as exc:
        raise InvalidRequestError(exc.problems, "patch") from None
    after = new.to_json()
    diff = {k: after[k] for k in SPEC_FIELDS if k in wanted and after[k] != old[k]}
    if agent_token is not None:
        # Before any custom rule is made: an agent's token never gets the daemon to import.
        loosening = loosens(old, diff)
        if loosening is not None:
            raise OutOfScopeError(agent_token, f"{loosening} (a person decides)")
    if "guardrails" in diff:
        # A custom rule is Python run in the daemon: made now, as at spawn.
        try:
            check_custom(new.guardrails)
        except InvalidSpecError as exc:
            raise InvalidRequestError(exc.problems, "patch") from None
    return new, diff


def loosens(old: Mapping[str, Any], diff: Mapping[str, Any]) -> str | None:
    """What in ``diff`` (changed spec fields, JSON) loosens the agent's supervision, in
    words; None when it only tightens."""
    if "notifyOn" in diff:
        removed = sorted(set(old["notifyOn"]) - set(diff["notifyOn"]))
        if removed:
            return f"removing notifyOn kinds {removed}"
    if "guardrails" in diff:
        before, after = list(old["guardrails"]), list(diff["guardrails"])
        if after[: len(before)] != before:
            return "removing, changing or reordering guardrail rules"
        for i, rule in enumerate(after[len(before) :], start=len(before)):
            verdict = rule.get("verdict")
            if verdict not in TIGHTER_VERDICTS:
                kind = "a custom" if verdict is None else f"an {verdict!r}"
                return f"adding {kind} guardrail rule (guardrails[{i}])"
    return None


def spec_changed(
    agent_id: str,
    old: Mapping[str, Any],
    diff: Mapping[str, Any],
    *,
    by: str | None,
    why: str | None,
    note: str | None = None,
) -> NewEvent:
    """``agent.spec_changed``: the changed fields (``changes``), what they were
    (``previous``), who and why, and whether the change loosened the agent's supervision."""
    data: dict[str, Any] = {
        "changes": dict(diff),
        "previous": {k: old[k] for k in diff},
        "by": by,
        "why": why,
        "loosens": loosens(old, diff) is not None,
    }
    if note is not None:
        data["note"] = note
    return NewEvent(SPEC_CHANGED, agent_id, data)
