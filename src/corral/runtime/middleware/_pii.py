"""``PIIRedaction``: keep personal data out of model requests and tool outputs."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from corral.kernel import ChatMessage, InvalidArgumentError, MiddlewareStage, ToolCall
from corral.runtime.middleware._pipeline import CallNext, MiddlewareContext

PII_KINDS: tuple[str, ...] = ("email", "credit_card", "ssn", "ipv4", "phone")
"""The built-in kinds, in the order they are applied."""

METADATA_KEY = "pii_redactions"

_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"

_PATTERNS: dict[str, re.Pattern[str]] = {
    "email": re.compile(
        r"(?<![\w.%+-])[A-Za-z0-9._%+-]+@(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+"
        r"[A-Za-z]{2,}(?![\w-])"
    ),
    # 13 to 19 digits, run together or in the usual groups (4-4-4-4+, or 4-6-4/5) with one
    # kind of separator, so runs of unrelated numbers are not read as one card; a match is
    # kept only if it passes the Luhn check
    "credit_card": re.compile(
        r"(?<![\w-])(?:\d{13,19}|\d{4}([ -])\d{4}\1\d{4}\1\d{1,7}|\d{4}([ -])\d{6}\2\d{4,5})"
        r"(?![\w-])"
    ),
    # area 000, 666 and 9xx, group 00 and serial 0000 are never issued
    "ssn": re.compile(r"(?<![\w-])(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?![\w-])"),
    "ipv4": re.compile(rf"(?<![\w.]){_OCTET}(?:\.{_OCTET}){{3}}(?!\w|\.\d)"),
    # international with a leading +, or North American with separators: bare digit runs are
    # left alone, they are far more often ids than phone numbers
    "phone": re.compile(
        r"(?<![\w+])(?:\+\d{1,3}(?:[ .-]?\(?\d{1,4}\)?){2,5}"
        r"|(?:\(\d{3}\)[ .-]?|\d{3}[ .-])\d{3}[ .-]\d{4})(?!\w)"
    ),
}


def luhn_valid(digits: str) -> bool:
    """True when ``digits`` (digits only) passes the Luhn checksum of payment card numbers."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def _card(text: str) -> bool:
    digits = re.sub(r"[ -]", "", text)
    return 13 <= len(digits) <= 19 and len(set(digits)) > 1 and luhn_valid(digits)


def _phone(text: str) -> bool:
    return 7 <= sum(ch.isdigit() for ch in text) <= 15


_VALIDATORS: dict[str, Callable[[str], bool]] = {"credit_card": _card, "phone": _phone}


class PIIRedaction:
    """Replaces personal data with ``replacement`` (``{kind}`` names what was removed).

    - CHAT: the outgoing messages (their text, and the string values of earlier tool calls'
      arguments) are replaced by redacted copies in a new list; the caller's list and
      messages are never mutated.
    - TOOL: the tool's output (a ``str`` result) is redacted after the call.

    Built-in kinds (:data:`PII_KINDS`): e-mail addresses, payment card numbers (Luhn-checked,
    so random digit runs stay), US social security numbers, IPv4 addresses, phone numbers
    (with a leading ``+``, or North American with separators). ``extra_patterns`` maps more
    kind names to regular expressions. Counts per kind are added up in
    ``ctx.metadata["pii_redactions"]``.

    Raises ``InvalidArgumentError`` for an unknown kind, a bad or empty-matching pattern, a
    replacement that is not a string with at most a ``{kind}`` field, or nothing to redact.
    """

    __slots__ = ("_rules", "kinds")

    stages = frozenset({MiddlewareStage.CHAT, MiddlewareStage.TOOL})

    def __init__(
        self,
        kinds: Iterable[str] = PII_KINDS,
        extra_patterns: Mapping[str, str | re.Pattern[str]] | None = None,
        replacement: str = "[REDACTED:{kind}]",
    ) -> None:
        where = "PIIRedaction"
        if isinstance(kinds, str) or not isinstance(kinds, Iterable):
            raise InvalidArgumentError(where, "kinds", "an iterable of kind names", kinds)
        chosen = tuple(kinds)
        for kind in chosen:
            if kind not in _PATTERNS:
                raise InvalidArgumentError(where, "kinds[]", f"one of {', '.join(PII_KINDS)}", kind)
        if not isinstance(replacement, str):
            raise InvalidArgumentError(where, "replacement", "a string", replacement)
        try:
            replacement.format(kind="x")
        except (KeyError, IndexError, ValueError):
            raise InvalidArgumentError(
                where, "replacement", "a string whose only format field is {kind}", replacement
            ) from None
        rules: list[tuple[str, re.Pattern[str], Callable[[str], bool] | None, str]] = [
            (k, _PATTERNS[k], _VALIDATORS.get(k), replacement.format(kind=k))
            for k in PII_KINDS
            if k in chosen
        ]
        if extra_patterns is not None:
            if not isinstance(extra_patterns, Mapping):
                raise InvalidArgumentError(
                    where, "extra_patterns", "a mapping of kind name to pattern", extra_patterns
                )
            for name, pattern in extra_patterns.items():
                rules.append(
                    (name, _compile(name, pattern, chosen), None, replacement.format(kind=name))
                )
        if not rules:
            raise InvalidArgumentError(where, "kinds", "at least one kind or extra pattern", chosen)
        self._rules = tuple(rules)
        self.kinds: tuple[str, ...] = tuple(rule[0] for rule in rules)

    def redact(self, text: str) -> tuple[str, dict[str, int]]:
        """``text`` with every match replaced, and how many of each kind were replaced."""
        counts: dict[str, int] = {}
        for kind, pattern, valid, repl in self._rules:
            found = 0

            def swap(
                m: re.Match[str], valid: Callable[[str], bool] | None = valid, repl: str = repl
            ) -> str:
                nonlocal found
                if valid is not None and not valid(m.group(0)):
                    return m.group(0)
                found += 1
                return repl

            text = pattern.sub(swap, text)
            if found:
                counts[kind] = found
        return text, counts

    async def process(self, ctx: MiddlewareContext, call_next: CallNext) -> None:
        if ctx.stage is MiddlewareStage.CHAT:
            counts: dict[str, int] = {}
            redacted = [self._message(m, counts) for m in ctx.messages]
            if counts:
                ctx.messages = redacted
                self._count(ctx, counts)
            await call_next()
        elif ctx.stage is MiddlewareStage.TOOL:
            await call_next()
            if isinstance(ctx.result, str):
                ctx.result, counts = self.redact(ctx.result)
                if counts:
                    self._count(ctx, counts)
        else:
            await call_next()

    def _message(self, message: ChatMessage, counts: dict[str, int]) -> ChatMessage:
        changes: dict[str, Any] = {}
        if message.content:
            content = self._text(message.content, counts)
            if content != message.content:
                changes["content"] = content
        if message.tool_calls:
            calls = tuple(self._call(call, counts) for call in message.tool_calls)
            if any(new is not old for new, old in zip(calls, message.tool_calls, strict=True)):
                changes["tool_calls"] = calls
        return dataclasses.replace(message, **changes) if changes else message

    def _call(self, call: ToolCall, counts: dict[str, int]) -> ToolCall:
        before = dict(counts)
        arguments = self._value(dict(call.arguments), counts)
        invalid = call.invalid_arguments
        if invalid:
            invalid = self._text(invalid, counts)
        if counts == before:
            return call
        return dataclasses.replace(call, arguments=arguments, invalid_arguments=invalid)

    def _value(self, value: Any, counts: dict[str, int]) -> Any:
        if isinstance(value, str):
            return self._text(value, counts)
        if isinstance(value, Mapping):
            return {k: self._value(item, counts) for k, item in value.items()}
        if isinstance(value, list | tuple):
            return [self._value(item, counts) for item in value]
        return value

    def _text(self, text: str, counts: dict[str, int]) -> str:
        text, found = self.redact(text)
        for kind, n in found.items():
            counts[kind] = counts.get(kind, 0) + n
        return text

    @staticmethod
    def _count(ctx: MiddlewareContext, counts: dict[str, int]) -> None:
        total = dict(ctx.metadata.get(METADATA_KEY) or {})
        for kind, n in counts.items():
            total[kind] = total.get(kind, 0) + n
        ctx.metadata[METADATA_KEY] = total

    def __repr__(self) -> str:
        return f"PIIRedaction(kinds={self.kinds!r})"


def _compile(name: Any, pattern: Any, builtin: tuple[str, ...]) -> re.Pattern[str]:
    where = "PIIRedaction"
    if not isinstance(name, str) or not name.strip():
        raise InvalidArgumentError(where, "extra_patterns key", "a non-empty string", name)
    if name in builtin:
        raise InvalidArgumentError(
            where, "extra_patterns key", "a name other than the chosen built-in kinds", name
        )
    if isinstance(pattern, str):
        try:
            pattern = re.compile(pattern)
        except re.error as exc:
            raise InvalidArgumentError(
                where, f"extra_patterns[{name!r}]", f"a valid regular expression ({exc})", pattern
            ) from None
    if not isinstance(pattern, re.Pattern) or not isinstance(pattern.pattern, str):
        raise InvalidArgumentError(
            where, f"extra_patterns[{name!r}]", "a str regular expression", pattern
        )
    if pattern.search("") is not None:
        raise InvalidArgumentError(
            where,
            f"extra_patterns[{name!r}]",
            "a pattern that cannot match the empty string",
            pattern.pattern,
        )
    return pattern
