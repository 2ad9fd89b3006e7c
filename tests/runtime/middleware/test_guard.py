import json
from dataclasses import dataclass
from typing import Any

import pytest

from corral.kernel import InvalidArgumentError, MiddlewareStage, RunMeta, ToolRefused
from corral.runtime import (
    Cancellation,
    FakeClock,
    MiddlewareContext,
    MiddlewarePipeline,
    ToolGuard,
)


@dataclass(frozen=True)
class Verdict:
    allowed: Any
    reason: str | None = None


def make_meta() -> RunMeta:
    clock = FakeClock()
    return RunMeta(cancellation=Cancellation(clock=clock), clock=clock, tenant_id="acme")


def tool_ctx(name: str = "search", **arguments: Any) -> MiddlewareContext:
    return MiddlewareContext.tool("agent-7", make_meta(), name, arguments, tool_call_id="c1")


class Tool:
    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, ctx: MiddlewareContext) -> None:
        self.calls += 1
        ctx.result = "tool output"


async def test_allowed_calls_run_and_the_check_sees_the_action_and_context() -> None:
    seen: list[tuple[str, str, dict[str, object]]] = []

    def check(agent_id: str, action: str, context: dict[str, object]) -> Verdict:
        seen.append((agent_id, action, context))
        return Verdict(True)

    ctx = tool_ctx("search", b=2, a="x y")
    tool = Tool()
    assert await MiddlewarePipeline([ToolGuard(check)]).run(ctx, tool) == "tool output"
    assert tool.calls == 1
    agent_id, action, context = seen[0]
    assert agent_id == "agent-7"
    assert action == 'search {"a": "x y", "b": 2}'
    assert json.loads(action.split(" ", 1)[1]) == {"a": "x y", "b": 2}
    assert context == {
        "tool": "search",
        "arguments": {"b": 2, "a": "x y"},
        "run_id": ctx.meta.run_id,
        "trace_id": ctx.meta.trace_id,
        "tenant_id": "acme",
    }


async def test_an_async_check_plugs_in_like_check_action() -> None:
    class Supervisor:
        async def check_action(
            self, agent_id: str, action: str, context: dict[str, object] | None = None
        ) -> Verdict:
            return Verdict("rm -rf" not in action, "destructive command")

    guard = ToolGuard(Supervisor().check_action)
    tool = Tool()
    assert await MiddlewarePipeline([guard]).run(tool_ctx("shell", cmd="ls"), tool) == "tool output"
    with pytest.raises(ToolRefused) as info:
        await MiddlewarePipeline([guard]).run(tool_ctx("shell", cmd="rm -rf /"), tool)
    assert tool.calls == 1
    assert info.value.code == "tool_refused"
    assert info.value.tool == "shell"
    assert info.value.message == "tool 'shell' refused: destructive command"


async def test_a_refusal_without_reason_still_says_who_refused() -> None:
    tool = Tool()
    with pytest.raises(ToolRefused, match="tool 'search' refused: refused by the guard"):
        await MiddlewarePipeline([ToolGuard(lambda *a: Verdict(False))]).run(tool_ctx(), tool)
    assert tool.calls == 0


async def test_a_raising_check_fails_closed() -> None:
    def broken(agent_id: str, action: str, context: dict[str, object]) -> Verdict:
        raise RuntimeError("policy store down")

    tool = Tool()
    with pytest.raises(ToolRefused) as info:
        await MiddlewarePipeline([ToolGuard(broken)]).run(tool_ctx(), tool)
    assert tool.calls == 0
    assert info.value.message == (
        "tool 'search' refused: the guard check raised RuntimeError: policy store down; refusing"
    )
    assert isinstance(info.value.__cause__, RuntimeError)


@pytest.mark.parametrize(
    ("verdict", "shown"),
    [
        (None, "NoneType"),
        (object(), "object"),
        (Verdict("yes"), "Verdict"),
        (Verdict(1), "Verdict"),
    ],
)
async def test_a_verdict_without_a_boolean_allowed_fails_closed(verdict: Any, shown: str) -> None:
    tool = Tool()
    with pytest.raises(
        ToolRefused, match=f"the guard check returned {shown} without a boolean 'allowed'"
    ):
        await MiddlewarePipeline([ToolGuard(lambda *a: verdict)]).run(tool_ctx(), tool)
    assert tool.calls == 0


async def test_arguments_that_are_not_json_fail_closed() -> None:
    circular: dict[str, Any] = {}
    circular["self"] = circular
    ctx = MiddlewareContext(
        stage=MiddlewareStage.TOOL,
        agent_id="a",
        meta=make_meta(),
        tool_name="t",
        arguments=circular,
    )
    tool = Tool()
    with pytest.raises(ToolRefused, match="cannot be written as JSON"):
        await MiddlewarePipeline([ToolGuard(lambda *a: Verdict(True))]).run(ctx, tool)
    assert tool.calls == 0


def test_runs_at_the_tool_stage_only() -> None:
    guard = ToolGuard(lambda *a: Verdict(False))
    pipeline = MiddlewarePipeline([guard])
    assert pipeline.for_stage(MiddlewareStage.TOOL) == (guard,)
    assert pipeline.for_stage(MiddlewareStage.CHAT) == ()
    assert pipeline.for_stage(MiddlewareStage.TURN) == ()


@pytest.mark.parametrize("bad", [None, "allow", 3])
def test_refuses_a_check_that_is_not_callable(bad: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="ToolGuard: check must be callable"):
        ToolGuard(bad)
