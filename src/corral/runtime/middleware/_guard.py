"""``ToolGuard``: ask a guard before every tool call, and refuse when it says no."""

from __future__ import annotations

import json

from corral.kernel import ActionCheck, MiddlewareStage, ToolRefused
from corral.kernel import _validate as v
from corral.runtime.middleware._pipeline import CallNext, MiddlewareContext, maybe_await


class ToolGuard:
    """Checks each tool call with ``check(agent_id, action, context)`` before it runs.

    ``check`` is plain or async (the shape of ``corral.kernel.ActionCheck``, so
    ``Supervisor.check_action`` plugs straight in) and returns something with ``allowed``
    and ``reason``. The action text is the tool name, a space, and the arguments as JSON with
    sorted keys; the context holds ``tool``, ``arguments``, ``run_id``, ``trace_id`` and
    ``tenant_id``.

    Raises ``ToolRefused(tool, reason)`` and the tool does not run when the verdict is not
    allowed. Fails closed: a check that raises, or returns something whose ``allowed`` is
    missing or not a bool, refuses too, with a reason that says so.
    """

    __slots__ = ("check",)

    stages = frozenset({MiddlewareStage.TOOL})

    def __init__(self, check: ActionCheck) -> None:
        v.callable_("ToolGuard", "check", check)
        self.check = check

    async def process(self, ctx: MiddlewareContext, call_next: CallNext) -> None:
        tool = ctx.tool_name or "<unnamed tool>"
        arguments = ctx.arguments
        try:
            shown = json.dumps(arguments, sort_keys=True, ensure_ascii=False, default=repr)
        except (TypeError, ValueError) as exc:
            raise ToolRefused(
                tool, f"its arguments cannot be written as JSON for the guard ({exc}); refusing"
            ) from exc
        action = f"{tool} {shown}"
        meta = ctx.meta
        context: dict[str, object] = {
            "tool": tool,
            "arguments": dict(arguments),
            "run_id": meta.run_id,
            "trace_id": meta.trace_id,
            "tenant_id": meta.tenant_id,
        }
        try:
            verdict = await maybe_await(self.check(ctx.agent_id, action, context))
        except Exception as exc:
            raise ToolRefused(
                tool, f"the guard check raised {type(exc).__name__}: {exc}; refusing"
            ) from exc
        allowed = getattr(verdict, "allowed", None)
        if not isinstance(allowed, bool):
            raise ToolRefused(
                tool,
                f"the guard check returned {type(verdict).__name__} without a boolean "
                f"'allowed' (got {allowed!r}); refusing",
            )
        if not allowed:
            reason = getattr(verdict, "reason", None)
            raise ToolRefused(tool, str(reason) if reason else "refused by the guard")
        await call_next()

    def __repr__(self) -> str:
        return f"ToolGuard({self.check!r})"
