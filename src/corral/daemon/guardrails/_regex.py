"""The regexes of guardrail rules: what is refused before compiling, and searching with a
timeout so that no rule can hold the daemon's event loop for long."""

from __future__ import annotations

import functools
import re
import time

import regex

MAX_PATTERN_CHARS = 1_000
# A counted repeat is compiled by unrolling its lower bound: "a{1000000}" takes a second and
# "(?:a{65535}){65535}" all the memory there is, before any search (whose timeout would
# help). So each lower bound is capped, and so is their product over the whole pattern (an
# upper bound on nesting that refuses few real patterns: a UUID's is 6144).
MAX_REPEAT = 1_000
MAX_REPEAT_PRODUCT = 10_000
# Seconds one search may take; a rule whose search takes longer blocks the action.
REGEX_TIMEOUT_S = 0.05
# Seconds all the searches of one evaluation may take together, however many rules there are.
REGEX_BUDGET_S = 0.25

# Every "{m}", "{m,}", "{m,n}" and "{,n}" (with the blanks verbose mode ignores), wherever it
# is: one that is really a literal only makes the check stricter than it needs to be.
_COUNTED = re.compile(r"\{([\d\s]*)(?:,[\d\s]*)?\}")


class RegexTooSlowError(Exception):
    """A rule's regex search timed out, or the evaluation's regex budget is spent; the rule
    then blocks (a supervisor turns the exception into a block with this message)."""


def regex_problem(pattern: str) -> str | None:
    """Why ``pattern`` cannot be a rule's regex, or None (it compiles, and is kept compiled)."""
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"must be at most {MAX_PATTERN_CHARS} characters, got {len(pattern)}"
    product = 1
    for found in _COUNTED.finditer(pattern):
        digits = "".join(found.group(1).split())
        low = int(digits) if digits else 0
        if low > MAX_REPEAT:
            return (
                f"repeats {found.group()!r} at least {low} times; a lower bound may be at most "
                f"{MAX_REPEAT} (compiling unrolls it)"
            )
        product *= max(low, 1)
        if product > MAX_REPEAT_PRODUCT:
            return (
                f"its counted repeats multiply to more than {MAX_REPEAT_PRODUCT} "
                "(compiling unrolls them); use fewer or smaller ones"
            )
    try:
        compiled(pattern)
    except Exception as exc:  # regex.error, and RecursionError for absurd nesting
        return f"is not a valid regular expression: {exc}"
    return None


@functools.lru_cache(maxsize=512)
def compiled(pattern: str) -> regex.Pattern[str]:
    """``pattern`` compiled (Python's ``re`` syntax, as the ``regex`` package reads it)."""
    return regex.compile(pattern)


class Search:
    """Matching of one action against rules, sharing :data:`REGEX_BUDGET_S` between them.

    A substring matches ignoring case (as ``corral.guard.HumanApproval`` patterns); a regex is
    searched as written (``(?i)`` makes it ignore case) for at most :data:`REGEX_TIMEOUT_S`.
    Raises :class:`RegexTooSlowError` when a search times out or the budget is spent.
    """

    __slots__ = ("_action", "_folded", "_left")

    def __init__(self, action: str) -> None:
        self._action = action
        self._folded: str | None = None
        self._left = REGEX_BUDGET_S

    def contains(self, pattern: str) -> bool:
        if self._folded is None:
            self._folded = self._action.casefold()
        return pattern.casefold() in self._folded

    def search(self, pattern: str, label: str, action: str | None = None) -> bool:
        """Whether ``pattern`` is found in the action (or in ``action``, when given);
        ``label`` names the rule in the error."""
        text = self._action if action is None else action
        if self._left <= 0:
            raise RegexTooSlowError(
                f"{label} was not checked: the rules' regexes already took "
                f"{REGEX_BUDGET_S:g} s on this action, which is blocked to be safe"
            )
        timeout = min(REGEX_TIMEOUT_S, self._left)
        started = time.perf_counter()
        try:
            return compiled(pattern).search(text, timeout=timeout) is not None
        except TimeoutError:
            raise RegexTooSlowError(
                f"{label}'s regex took longer than {timeout:g} s on this action "
                f"({len(text)} characters), which is blocked to be safe"
            ) from None
        finally:
            self._left -= time.perf_counter() - started
