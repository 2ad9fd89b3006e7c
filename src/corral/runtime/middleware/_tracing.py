"""``Tracing``: an OpenTelemetry span around each turn, model call and tool call."""

from __future__ import annotations

from corral.kernel import MiddlewareStage
from corral.runtime import _tracing
from corral.runtime._llm import ChatResult
from corral.runtime.middleware._pipeline import CallNext, MiddlewareContext


class Tracing:
    """Puts each call in a span of the run's trace (``ctx.meta.trace_id``, see
    ``corral.runtime._tracing``): ``invoke_agent <agent>`` around a TURN, ``chat <model>``
    around a CHAT model call (with the tokens it used and its cost), ``execute_tool <tool>``
    around a TOOL call. Names and attributes follow OpenTelemetry's generative-AI conventions
    (``gen_ai.*``) where they have one, ``corral.*`` otherwise; neither messages, arguments
    nor outputs are recorded (they may hold anything an agent read), nor the message of an
    exception that fails a span (it may quote them): only its type.

    A call that raises marks its span failed (with the exception's type) and goes on raising.
    Put it first among the middlewares, so its span covers the others' work (retries, the
    guard's check). Without OpenTelemetry installed it only calls ``call_next``.
    """

    __slots__ = ()

    async def process(self, ctx: MiddlewareContext, call_next: CallNext) -> None:
        meta = ctx.meta
        stage = ctx.stage
        common: dict[str, _tracing.AttributeValue | None] = {
            "corral.agent.id": ctx.agent_id,
            "corral.run.id": meta.run_id,
            "corral.tenant.id": meta.tenant_id,
        }
        if stage is MiddlewareStage.CHAT:
            model = ctx.options.get("model")
            name = f"chat {model}" if isinstance(model, str) else "chat"
            attributes = {**common, "gen_ai.operation.name": "chat"}
            if isinstance(model, str):
                attributes["gen_ai.request.model"] = model
            with _tracing.span(
                name, attributes, trace_id=meta.trace_id, kind="client", quiet=True
            ) as span:
                await call_next()
                result = ctx.result
                if isinstance(result, ChatResult):
                    span.set_all(
                        {
                            "gen_ai.response.model": result.model,
                            "gen_ai.usage.input_tokens": result.usage.prompt_tokens,
                            "gen_ai.usage.output_tokens": result.usage.completion_tokens,
                            "corral.cost_usd": result.cost_usd,
                            "corral.cached": result.cached,
                        }
                    )
        elif stage is MiddlewareStage.TOOL:
            tool = ctx.tool_name or "tool"
            attributes = {
                **common,
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": ctx.tool_name,
                "gen_ai.tool.call.id": ctx.tool_call_id,
            }
            with _tracing.span(
                f"execute_tool {tool}", attributes, trace_id=meta.trace_id, quiet=True
            ):
                await call_next()
        else:
            attributes = {**common, "gen_ai.operation.name": "invoke_agent"}
            name = f"invoke_agent {ctx.agent_id}"
            with _tracing.span(name, attributes, trace_id=meta.trace_id, quiet=True):
                await call_next()

    def __repr__(self) -> str:
        return "Tracing()"
