"""A middleware writing each model call and tool call of an agent loop to a turn's log (the
``openai`` harness's turns; a ``python`` function's agent loop through
``TurnContext.call_log()``)."""

from __future__ import annotations

import json

from corral.daemon.harnesses._base import TurnOutput
from corral.kernel import MiddlewareStage
from corral.runtime import CallNext, ChatResult, MiddlewareContext

_SHOWN = 500  # characters of a reply, arguments or a tool's result the log line shows


class CallLog:
    """Writes each model call and tool call to the turn's log (``request.log``): a line as
    it starts (a tool's arguments) and one as it ends (the reply's tokens, cost, tool calls
    and the start of its text; the tool's result), each cut at :data:`_SHOWN` characters."""

    stages = frozenset({MiddlewareStage.CHAT, MiddlewareStage.TOOL})

    def __init__(self, log: TurnOutput) -> None:
        self.log = log

    async def process(self, ctx: MiddlewareContext, call_next: CallNext) -> None:
        chat = ctx.stage is MiddlewareStage.CHAT
        if not chat:
            self._say("tool", f"{ctx.tool_name} {_cut(json.dumps(ctx.arguments, default=str))}")
        try:
            await call_next()
        except BaseException as exc:
            kind = "model" if chat else "tool"
            self._say(kind, f"{ctx.tool_name or 'call'} failed: {type(exc).__name__}: {exc}")
            raise
        result = ctx.result
        if chat and isinstance(result, ChatResult):
            calls = ", ".join(c.name for c in result.tool_calls)
            cost = "unknown" if result.cost_usd is None else f"${result.cost_usd:.6f}"
            line = (
                f"{result.model or 'model'}: {result.usage.total_tokens} tokens, {cost}"
                + (f", tool calls: {calls}" if calls else "")
                + (f": {_cut(result.message.content)}" if result.message.content else "")
            )
            self._say("model", line)
        elif not chat:
            self._say("tool", f"{ctx.tool_name} -> {_cut(str(result))}")

    def _say(self, stream: str, text: str) -> None:
        self.log.write(stream, text.replace("\n", " ") + "\n")


def _cut(text: str) -> str:
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN]}... ({len(text)} characters)"
