"""``CancellationCheck``: stop a cancelled or overdue run before each call goes inward."""

from __future__ import annotations

from corral.runtime.middleware._pipeline import CallNext, MiddlewareContext


class CancellationCheck:
    """At every stage, call ``ctx.meta.check()`` before going inward.

    Raises ``CancellationError`` when the run is cancelled and ``DeadlineExceededError`` when
    its deadline has passed; the call does not start.
    """

    __slots__ = ()

    async def process(self, ctx: MiddlewareContext, call_next: CallNext) -> None:
        ctx.meta.check()
        await call_next()

    def __repr__(self) -> str:
        return "CancellationCheck()"
