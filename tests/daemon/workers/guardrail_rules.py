"""Python guardrails that custom rules name (``tests.daemon.workers.guardrail_rules:...``)."""

from __future__ import annotations

from collections.abc import Mapping

from corral.guard import GuardrailResult

MODULE = "tests.daemon.workers.guardrail_rules"


class Keyword:
    """Blocks (or warns about) actions holding ``word``; counts instances and checks."""

    made = 0

    def __init__(self, word: str, warn: bool = False) -> None:
        Keyword.made += 1
        self.name = f"keyword-{word}"
        self.word = word
        self.warn = warn
        self.checks = 0

    def check(self, agent_id: str, action: str, context: Mapping[str, object]) -> GuardrailResult:
        self.checks += 1
        if self.word not in action:
            return GuardrailResult.allow()
        reason = f"{agent_id} said {self.word} ({context.get('where', 'nowhere')})"
        return GuardrailResult.warning(reason) if self.warn else GuardrailResult.blocked(reason)


class AsyncKeyword(Keyword):
    async def check(  # type: ignore[override]
        self, agent_id: str, action: str, context: Mapping[str, object]
    ) -> GuardrailResult:
        return super().check(agent_id, action, context)


class Raising:
    name = "raising"

    def check(self, agent_id: str, action: str, context: Mapping[str, object]) -> GuardrailResult:
        raise RuntimeError("the rule fell over")


class WrongAnswer:
    name = "wrong-answer"

    def check(self, agent_id: str, action: str, context: Mapping[str, object]) -> object:
        return "yes"


class BadInit:
    name = "bad-init"

    def __init__(self) -> None:
        raise ValueError("cannot start")


class Nameless:
    name = "  "

    def check(self, agent_id: str, action: str, context: Mapping[str, object]) -> GuardrailResult:
        return GuardrailResult.allow()


class NoCheck:
    name = "no-check"


NOT_CALLABLE = 42
