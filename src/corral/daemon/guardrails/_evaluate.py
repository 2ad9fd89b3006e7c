"""Checking one action against rules: a ``corral.guard.Supervisor`` over one guardrail per
rule, ``ask`` rules being ``corral.guard.HumanApproval`` guardrails."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal, cast

from corral.daemon._errors import InvalidRequestError
from corral.daemon._text import text_problem
from corral.daemon.guardrails._custom import instance
from corral.daemon.guardrails._regex import RegexTooSlowError, Search
from corral.daemon.guardrails._rules import (
    DEFAULT_ASK_TIMEOUT_S,
    CustomRule,
    EffectiveRule,
    MatchRule,
    Rule,
)
from corral.guard import (
    AgentGroup,
    ApprovalRequest,
    Guardrail,
    GuardrailResult,
    HumanApproval,
    Supervisor,
)
from corral.kernel import InvalidArgumentError
from corral.kernel import _validate as v

MAX_ACTION_CHARS = 16_384

# A supervisor needs a group; the rules answer for any agent, so it stays empty.
_GROUP = AgentGroup("daemon-guardrails")
_ALLOW = GuardrailResult.allow()


@dataclass(frozen=True, slots=True)
class AskRequest:
    """An ``ask`` rule wants a person's answer: ``rule`` is the ``index``-th of the rules
    given to :func:`evaluate`; answer with ``request.approve()`` / ``request.deny()``.
    Nothing times out by itself: whoever answers applies :attr:`timeout_s` and
    :attr:`on_timeout`."""

    index: int
    rule: EffectiveRule
    request: ApprovalRequest

    @property
    def timeout_s(self) -> float:
        """Seconds the rule gives a person to answer."""
        rule = self.rule.rule
        if isinstance(rule, MatchRule) and rule.timeout_s is not None:
            return rule.timeout_s
        return DEFAULT_ASK_TIMEOUT_S

    @property
    def on_timeout(self) -> Literal["deny", "allow"]:
        """The answer when no person answers in time."""
        rule = self.rule.rule
        if isinstance(rule, MatchRule) and rule.on_timeout is not None:
            return rule.on_timeout
        return "deny"


OnAsk = Callable[[AskRequest], "object | Awaitable[object]"]


def action_problems(action: object) -> list[dict[str, Any]]:
    """Why ``action`` cannot be checked, as ``{"field": "action", "message"}`` problems: not a
    string, empty, longer than :data:`MAX_ACTION_CHARS`, or holding text no store can keep."""
    if not isinstance(action, str):
        return [{"field": "action", "message": f"must be a string, not {type(action).__name__}"}]
    message: str | None
    if len(action) > MAX_ACTION_CHARS:
        message = f"may be at most {MAX_ACTION_CHARS} characters, got {len(action)}"
    elif not action.strip():
        message = "must not be empty or only blanks"
    else:
        message = text_problem(action)
    return [] if message is None else [{"field": "action", "message": message}]


async def evaluate(
    rules: Sequence[Rule | EffectiveRule],
    agent_id: str,
    action: str,
    context: Mapping[str, object] | None,
    on_ask: OnAsk,
) -> GuardrailResult:
    """May ``agent_id`` do ``action``? The rules answer, in order, as a
    ``corral.guard.Supervisor`` does:

    - an ``allow`` rule that matches ends the check, allowed: the rules after it are not
      evaluated (so an exception goes before the rule it excepts);
    - the first ``block`` that matches wins, with the rule's reason (or one naming the rule);
    - a ``warn`` that matches adds to the result's ``warnings`` and the check goes on;
    - an ``ask`` that matches calls ``on_ask`` (plain or async) with an :class:`AskRequest`
      and waits, without a timeout, until ``request.approval`` is answered: approved goes on
      to the next rules, denied (or a raising ``on_ask``, or a cancelled request) blocks;
    - a custom rule answers as its guardrail does; one that cannot be made, raises, or
      answers something else blocks;
    - a regex that takes longer than ``REGEX_TIMEOUT_S`` (or after the evaluation's
      ``REGEX_BUDGET_S`` is spent) blocks, saying so.

    Plain rules are taken as :class:`EffectiveRule` with no source, numbered by position.
    Raises ``InvalidRequestError`` for an action :func:`action_problems` refuses and
    ``InvalidArgumentError`` for an empty ``agent_id``, a ``context`` that is not a mapping,
    a non-callable ``on_ask`` or something in ``rules`` that is not a rule.
    """
    problems = action_problems(action)
    if problems:
        raise InvalidRequestError(problems, what="action")
    where = "evaluate"
    v.non_empty_str(where, "agent_id", agent_id)
    if context is not None:
        v.instance_of(where, "context", context, Mapping)
    v.callable_(where, "on_ask", on_ask)
    plan = _plan(rules)
    search = Search(action)
    supervisor: Supervisor | None = None
    # Only the rules before the first matching allow are asked at all.
    for position in plan.allows:
        rule = cast(MatchRule, plan.rules[position].rule)
        try:
            if _matches(search, rule, plan.names[position], action):
                supervisor = plan.supervisor(position)
                break
        except RegexTooSlowError as exc:
            # It blocks where it stands (rare: made for this check only).
            before = [g for g in plan.guardrails[:position] if g is not None]
            supervisor = Supervisor(_GROUP, [*before, _Failing(plan.names[position], exc)])
            break
    if supervisor is None:
        supervisor = plan.supervisor(len(plan.rules))
    if not supervisor.guardrails:
        return _ALLOW
    token = _CALL.set(_Call(search, on_ask))
    try:
        return await supervisor.check_action(agent_id, action, context)
    finally:
        _CALL.reset(token)


@dataclass(frozen=True, slots=True)
class _Call:
    """What one evaluation's guardrails share: the action's search, and whom to ask."""

    search: Search
    on_ask: OnAsk


# The guardrails of a plan serve every evaluation that uses it; each reads its own.
_CALL: ContextVar[_Call] = ContextVar("corral_guardrails_call")


class _Plan:
    """The guardrails of one list of rules, made once (``None`` for an allow rule), and a
    supervisor for each prefix an allow rule can cut the list to."""

    __slots__ = ("_supervisors", "allows", "guardrails", "names", "rules")

    def __init__(self, rules: tuple[EffectiveRule, ...]) -> None:
        self.rules = rules
        names: list[str] = []
        guardrails: list[Guardrail | None] = []
        for position, item in enumerate(rules):
            name = item.label if item.label not in names else f"{item.label} #{position}"
            names.append(name)
            rule = item.rule
            if isinstance(rule, CustomRule):
                guardrails.append(_Custom(name, rule))
            elif rule.verdict == "allow":
                guardrails.append(None)
            elif rule.verdict == "ask":
                guardrails.append(_approval(name, position, item, rule))
            else:
                guardrails.append(_Verdict(name, rule))
        self.names = tuple(names)
        self.guardrails = tuple(guardrails)
        self.allows = tuple(i for i, g in enumerate(guardrails) if g is None)
        self._supervisors: dict[int, Supervisor] = {}

    def supervisor(self, cut: int) -> Supervisor:
        """The supervisor over the guardrails of the rules before position ``cut``."""
        found = self._supervisors.get(cut)
        if found is None:
            # Two checks may make one at once: the same guardrails, whichever is kept.
            kept = [g for g in self.guardrails[:cut] if g is not None]
            found = self._supervisors.setdefault(cut, Supervisor(_GROUP, kept))
        return found


_MAX_PLANS = 1024
_plans: OrderedDict[tuple[Hashable, ...], _Plan] = OrderedDict()
_plans_lock = threading.Lock()


def _plan(rules: Sequence[Rule | EffectiveRule]) -> _Plan:
    """The plan of ``rules``, kept by their content (the service may validate a spec again
    for each check) for the next evaluation of equal rules."""
    effective = tuple(_effective(given, position) for position, given in enumerate(rules))
    key = tuple((_key(item.rule), item.source, item.index) for item in effective)
    with _plans_lock:
        found = _plans.get(key)
        if found is not None:
            _plans.move_to_end(key)
            return found
    plan = _Plan(effective)
    with _plans_lock:
        found = _plans.setdefault(key, plan)
        while len(_plans) > _MAX_PLANS:
            _plans.popitem(last=False)
    return found


def _key(rule: Rule) -> Hashable:
    # A match rule is hashable by value; a custom rule's options are a dict.
    if isinstance(rule, CustomRule):
        return ("custom", rule.guardrail, rule.options_json, rule.name)
    return rule


def _effective(given: object, position: int) -> EffectiveRule:
    if isinstance(given, EffectiveRule):
        return given
    if isinstance(given, MatchRule | CustomRule):
        return EffectiveRule(given, None, position)
    raise InvalidArgumentError(
        "evaluate", "rules[]", "a MatchRule, CustomRule or EffectiveRule", given
    )


def may_ask(rules: Sequence[Rule | EffectiveRule], action: str) -> bool:
    """Whether checking ``action`` could ask a person: some ``ask`` rule matches it (a regex
    that takes too long counts as a match, so the check that follows decides). A check for
    which this is False never calls ``on_ask``, so a caller can skip what it sets up for
    people."""
    search = Search(action)
    for item in rules:
        rule = item.rule if isinstance(item, EffectiveRule) else item
        if not isinstance(rule, MatchRule) or rule.verdict != "ask":
            continue
        try:
            if _matches(search, rule, "ask rule", action):
                return True
        except RegexTooSlowError:
            return True
    return False


def _matches(search: Search, rule: MatchRule, name: str, action: str) -> bool:
    if isinstance(rule.match, str):
        return search.contains(rule.match)
    return search.search(rule.match.regex, name, action)


def _approval(name: str, position: int, item: EffectiveRule, rule: MatchRule) -> HumanApproval:
    def on_request(request: ApprovalRequest) -> object:
        return _CALL.get().on_ask(AskRequest(position, item, request))

    if isinstance(rule.match, str):
        return HumanApproval((rule.match,), on_request, name=name)
    pattern = rule.match.regex

    def matches(action: str) -> bool:
        return _CALL.get().search.search(pattern, name, action)

    return HumanApproval((), on_request, name=name, matches=matches)


class _Verdict:
    """A ``warn`` or ``block`` rule: its result when the action matches, allowed otherwise."""

    __slots__ = ("_result", "_rule", "name")

    def __init__(self, name: str, rule: MatchRule) -> None:
        self.name = name
        self._rule = rule
        if rule.verdict == "block":
            self._result = GuardrailResult.blocked(rule.reason or f"{name} blocks this action")
        else:
            self._result = GuardrailResult.warning(rule.reason or f"{name} warns about it")

    def check(self, agent_id: str, action: str, context: Mapping[str, object]) -> GuardrailResult:
        search = _CALL.get().search
        return self._result if _matches(search, self._rule, self.name, action) else _ALLOW


class _Custom:
    """A custom rule: its guardrail (made on first use, then kept) answers."""

    __slots__ = ("_made", "_rule", "name")

    def __init__(self, name: str, rule: CustomRule) -> None:
        self.name = name
        self._rule = rule
        self._made: Guardrail | None = None

    def check(
        self, agent_id: str, action: str, context: Mapping[str, object]
    ) -> GuardrailResult | Awaitable[GuardrailResult]:
        if self._made is None:
            self._made = instance(self._rule)  # raises (so blocks) until it can be made
        return self._made.check(agent_id, action, context)


class _Failing:
    """An allow rule whose regex could not be searched in time: it blocks where it stands."""

    __slots__ = ("_error", "name")

    def __init__(self, name: str, error: RegexTooSlowError) -> None:
        self.name = name
        self._error = error

    def check(self, agent_id: str, action: str, context: Mapping[str, object]) -> GuardrailResult:
        raise self._error
