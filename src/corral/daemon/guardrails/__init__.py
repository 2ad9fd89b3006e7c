"""Guardrail rules of agent specs and of the daemon-wide rules file (docs/daemon.md,
"Guardrails and approvals").

A rule is a :class:`MatchRule` (``{"match": "deploy" | {"regex": ...}, "verdict": "allow" |
"warn" | "block" | "ask", ...}``) or a :class:`CustomRule` (``{"guardrail":
"package.module:Class", "options": {...}}``). :func:`parse_rules` and :func:`load_rules_file`
validate them, :func:`effective_rules` orders the daemon's and an agent chain's rules, and
:func:`evaluate` checks one action against them with ``corral.guard.Supervisor`` and
``corral.guard.HumanApproval``. Nothing here stores or times out anything: the service does.
"""

from corral.daemon.guardrails._custom import GuardrailLoadError, check_custom
from corral.daemon.guardrails._evaluate import (
    MAX_ACTION_CHARS,
    AskRequest,
    OnAsk,
    action_problems,
    evaluate,
    may_ask,
)
from corral.daemon.guardrails._parse import MAX_FILE_BYTES, load_rules_file, parse_rules
from corral.daemon.guardrails._regex import (
    MAX_PATTERN_CHARS,
    MAX_REPEAT,
    MAX_REPEAT_PRODUCT,
    REGEX_BUDGET_S,
    REGEX_TIMEOUT_S,
)
from corral.daemon.guardrails._rules import (
    DAEMON,
    DEFAULT_ASK_TIMEOUT_S,
    MAX_ASK_TIMEOUT_S,
    MAX_NAME_CHARS,
    MAX_OPTIONS_CHARS,
    MAX_REASON_CHARS,
    MAX_RULES,
    CustomRule,
    EffectiveRule,
    MatchRule,
    RegexMatch,
    Rule,
    RuleField,
    RuleList,
    effective_rules,
    has_custom,
    rule_to_json,
)

__all__ = [
    "DAEMON",
    "DEFAULT_ASK_TIMEOUT_S",
    "MAX_ACTION_CHARS",
    "MAX_ASK_TIMEOUT_S",
    "MAX_FILE_BYTES",
    "MAX_NAME_CHARS",
    "MAX_OPTIONS_CHARS",
    "MAX_PATTERN_CHARS",
    "MAX_REASON_CHARS",
    "MAX_REPEAT",
    "MAX_REPEAT_PRODUCT",
    "MAX_RULES",
    "REGEX_BUDGET_S",
    "REGEX_TIMEOUT_S",
    "AskRequest",
    "CustomRule",
    "EffectiveRule",
    "GuardrailLoadError",
    "MatchRule",
    "OnAsk",
    "RegexMatch",
    "Rule",
    "RuleField",
    "RuleList",
    "action_problems",
    "check_custom",
    "effective_rules",
    "evaluate",
    "may_ask",
    "has_custom",
    "load_rules_file",
    "parse_rules",
    "rule_to_json",
]
