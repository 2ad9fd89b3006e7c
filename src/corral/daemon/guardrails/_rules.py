"""What a guardrail rule is: the JSON of an agent spec's ``guardrails`` and of the daemon-wide
rules file, validated into frozen models, and where each rule applies."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeAlias

import pydantic
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    WrapValidator,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from corral.daemon._text import json_problems, text_problem
from corral.daemon.guardrails._regex import MAX_PATTERN_CHARS, regex_problem
from corral.kernel import InvalidArgumentError

MAX_RULES = 100
MAX_REASON_CHARS = 2_000
MAX_NAME_CHARS = 200
MAX_OPTIONS_CHARS = 16_384
DEFAULT_ASK_TIMEOUT_S = 3600.0
MAX_ASK_TIMEOUT_S = 7 * 24 * 3600.0
DAEMON = "daemon"

_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
_MAX_PATH_CHARS = 300


def _problem(message: str) -> PydanticCustomError:
    # The message goes in as context: a template's braces would be read as placeholders.
    return PydanticCustomError("guardrail_rule", "{message}", {"message": message})


def _text(value: str, what: str, limit: int, *, identifier: bool = False) -> str:
    """``value`` if it is a non-blank string of at most ``limit`` characters that a store can
    keep; a problem otherwise."""
    if len(value) > limit:
        raise _problem(f"{what} may be at most {limit} characters, got {len(value)}")
    if not value.strip():
        raise _problem(f"{what} must not be empty or only blanks")
    problem = text_problem(value, identifier=identifier)
    if problem is not None:
        raise _problem(problem)
    return value


class _Model(BaseModel):
    # As the agent spec's models: camelCase, nothing unknown, immutable.
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class RegexMatch(_Model):
    """``{"regex": "..."}``: a regular expression searched in the action, as written."""

    regex: str = Field(strict=True)

    @field_validator("regex")
    @classmethod
    def _compiles(cls, value: str) -> str:
        _text(value, "a regex", MAX_PATTERN_CHARS)
        problem = regex_problem(value)
        if problem is not None:
            raise _problem(problem)
        return value


def _match(value: Any, handler: Any) -> str | RegexMatch:
    # One branch or the other, chosen by the JSON type, so an error names one, not both.
    if isinstance(value, str):
        return _text(value, "a match string", MAX_PATTERN_CHARS)
    if isinstance(value, RegexMatch):
        return value
    if isinstance(value, dict):
        return RegexMatch.model_validate(value)
    raise _problem(
        'must be a string (found in the action, ignoring case) or {"regex": "..."}, '
        f"not {type(value).__name__}"
    )


class MatchRule(_Model):
    """``{"match", "verdict", "reason"?, "timeoutS"?, "onTimeout"?}``: the verdict applies
    to an action the match is found in.

    ``timeoutS`` (seconds, > 0, at most 7 days) and ``onTimeout`` are for ``ask`` only, which
    gets 3600 and ``deny`` when they are not given.
    """

    match: Annotated[str | RegexMatch, WrapValidator(_match)]
    verdict: Literal["allow", "warn", "block", "ask"]
    reason: str | None = None
    timeout_s: float | None = Field(
        default=None, gt=0, le=MAX_ASK_TIMEOUT_S, allow_inf_nan=False, strict=True
    )
    on_timeout: Literal["deny", "allow"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _ask_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("verdict") != "ask":
            return data
        filled = dict(data)
        for alias, name, default in (
            ("timeoutS", "timeout_s", DEFAULT_ASK_TIMEOUT_S),
            ("onTimeout", "on_timeout", "deny"),
        ):
            if filled.get(alias) is None and filled.get(name) is None:
                filled.pop(name, None)
                filled[alias] = default
        return filled

    @field_validator("reason")
    @classmethod
    def _reason(cls, value: str | None) -> str | None:
        return None if value is None else _text(value, "a reason", MAX_REASON_CHARS)

    @field_validator("timeout_s", "on_timeout")
    @classmethod
    def _ask_only(cls, value: object, info: ValidationInfo) -> object:
        verdict = info.data.get("verdict")
        if value is not None and verdict is not None and verdict != "ask":
            raise _problem(f"only for verdict 'ask', not {verdict!r}")
        return value

    @property
    def pattern(self) -> str:
        """The match string, or the regex."""
        return self.match if isinstance(self.match, str) else self.match.regex


class CustomRule(_Model):
    """``{"guardrail": "package.module:Class", "options"?: {...}, "name"?}``: a Python
    guardrail (``corral.guard.Guardrail``) made as ``Class(**options)`` inside the daemon."""

    guardrail: str = Field(strict=True)
    options: dict[str, Any] = Field(default_factory=dict)
    name: str | None = None

    @field_validator("guardrail")
    @classmethod
    def _path(cls, value: str) -> str:
        _text(value, "a guardrail path", _MAX_PATH_CHARS)
        if not _PATH.fullmatch(value):
            raise _problem(f"must look like 'package.module:Class', got {value!r}")
        return value

    @field_validator("options")
    @classmethod
    def _options(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:
            encoded = json.dumps(value, allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            raise _problem(f"must be a JSON object: {exc}") from None
        if len(encoded) > MAX_OPTIONS_CHARS:
            raise _problem(
                f"may be at most {MAX_OPTIONS_CHARS} characters as JSON, got {len(encoded)}"
            )
        problems = json_problems(value)
        if problems:
            first = problems[0]
            raise _problem(f"{printable(first['field'])}: {first['message']}")
        return value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        return None if value is None else _text(value, "a name", MAX_NAME_CHARS, identifier=True)

    @property
    def options_json(self) -> str:
        """The options as canonical JSON (keys sorted): with the path, what an instance is
        cached by."""
        return json.dumps(self.options, sort_keys=True, separators=(",", ":"))


Rule: TypeAlias = MatchRule | CustomRule


def _rule(value: Any, handler: Any) -> Rule:
    if isinstance(value, MatchRule | CustomRule):
        return value
    if not isinstance(value, dict):
        raise _problem(
            'must be an object: {"match": ..., "verdict": ...} or {"guardrail": ...}, '
            f"not {type(value).__name__}"
        )
    if "guardrail" in value:
        return CustomRule.model_validate(value)
    return MatchRule.model_validate(value)


def _cap(value: Any) -> Any:
    # Before the rules themselves are looked at: a million of them are refused at once.
    if not isinstance(value, list | tuple):
        raise _problem(f"must be a list of rules, not {type(value).__name__}")
    if len(value) > MAX_RULES:
        raise _problem(f"may hold at most {MAX_RULES} rules, got {len(value)}")
    return value


RuleField = Annotated[Rule, WrapValidator(_rule)]
"""One rule as a pydantic field: a :class:`MatchRule` or a :class:`CustomRule`, told apart by
the ``guardrail`` key."""
RuleList = Annotated[tuple[RuleField, ...], BeforeValidator(_cap)]
"""At most :data:`MAX_RULES` rules, as a pydantic field."""

RULES: pydantic.TypeAdapter[tuple[Rule, ...]] = pydantic.TypeAdapter(RuleList)


# What a path must not print raw (keys come from the input): controls, lone surrogates and
# the bidirectional overrides, shown as \\uXXXX instead.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with every control character, lone surrogate and bidirectional override
    written as ``\\uXXXX``: safe in a message printed anywhere."""
    return _UNPRINTABLE.sub(lambda found: f"\\u{ord(found.group()):04x}", text)


def field_path(field: str, loc: Iterable[int | str]) -> str:
    """A pydantic error location under ``field`` as a path: ``guardrails[2].match.regex``
    (keys from the input made :func:`printable`)."""
    path = field
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{printable(part)}" if path else printable(part)
    return path or "(body)"


def rule_problems(exc: pydantic.ValidationError, field: str) -> list[dict[str, Any]]:
    """The errors of validating rules under ``field``, as ``{"field", "message"}``."""
    return [
        {
            "field": field_path(field, error["loc"]),
            "message": "unknown field" if error["type"] == "extra_forbidden" else error["msg"],
        }
        for error in exc.errors()
    ]


@dataclass(frozen=True, slots=True)
class EffectiveRule:
    """A rule where it applies: ``source`` is ``"daemon"`` for the daemon-wide rules, the id
    of the agent whose spec holds it, or None when not told; ``index`` is its position there.
    """

    rule: Rule
    source: str | None
    index: int

    @property
    def label(self) -> str:
        """How a result or a log names the rule: ``daemon rule 0``, ``agent a_1 rule 2``."""
        where = (
            ""
            if self.source is None
            else ("daemon " if self.source == DAEMON else f"agent {self.source} ")
        )
        label = f"{where}rule {self.index}"
        if isinstance(self.rule, CustomRule) and self.rule.name is not None:
            label += f" ({self.rule.name})"
        return label


def effective_rules(
    daemon_rules: Iterable[Rule], chain_rules: Iterable[tuple[str, Sequence[Rule]]]
) -> tuple[EffectiveRule, ...]:
    """The rules an agent's actions are checked against, in order: the daemon-wide rules,
    then each ancestor's (root first), then the agent's own, as ``chain_rules`` gives them
    (``(agent id, its spec's rules)``, root first, the agent last).

    A child therefore inherits its parent's rules and can only add to them; no spec removes a
    daemon rule. Raises ``InvalidArgumentError`` for an agent id that is empty,
    ``"daemon"``, or given twice.
    """
    where = "effective_rules"
    found = [EffectiveRule(rule, DAEMON, i) for i, rule in enumerate(daemon_rules)]
    seen: set[str] = set()
    for agent_id, rules in chain_rules:
        if not isinstance(agent_id, str) or not agent_id or agent_id == DAEMON:
            raise InvalidArgumentError(
                where, "chain_rules[].agent_id", "a non-empty string other than 'daemon'", agent_id
            )
        if agent_id in seen:
            raise InvalidArgumentError(
                where, "chain_rules[].agent_id", "an agent id not already in the chain", agent_id
            )
        seen.add(agent_id)
        found.extend(EffectiveRule(rule, agent_id, i) for i, rule in enumerate(rules))
    return tuple(found)


def has_custom(rules: Iterable[Rule | EffectiveRule]) -> bool:
    """Whether any of ``rules`` is a :class:`CustomRule` (Python run inside the daemon)."""
    return any(
        isinstance(rule.rule if isinstance(rule, EffectiveRule) else rule, CustomRule)
        for rule in rules
    )


def rule_to_json(rule: Rule | EffectiveRule) -> dict[str, Any]:
    """A rule as camelCase JSON without empty fields (an ``ask`` rule shows its timeout and
    ``onTimeout``); an :class:`EffectiveRule` adds ``source`` and ``index``."""
    if isinstance(rule, EffectiveRule):
        shown = rule_to_json(rule.rule)
        if rule.source is not None:
            shown["source"] = rule.source
        shown["index"] = rule.index
        return shown
    return rule.model_dump(mode="json", by_alias=True, exclude_none=True)
