"""A harness whose turns the test scripts: outcomes per agent name, and turns that wait."""

from __future__ import annotations

import asyncio
from collections import defaultdict, deque
from pathlib import Path

from corral.daemon import TurnFailedError, TurnRequest, TurnResult


class ScriptedHarness:
    """Each agent (by name) answers its turns from a queue of outcomes.

    An outcome is a str (success with that output), ``TurnFailedError`` / an exception
    instance (raised), ``"hang"`` (the turn waits until cancelled or :meth:`release`d), or
    a ``TurnResult``. With no outcome queued a turn succeeds with output ``"ok"``.
    ``requests`` records every turn; ``reaped`` every agent passed to :meth:`reap`.
    """

    def __init__(self) -> None:
        self.outcomes: dict[str, deque[object]] = defaultdict(deque)
        self.requests: list[TurnRequest] = []
        self.reaped: list[str] = []
        self.running: set[str] = set()
        self.cancelled: list[str] = []
        self._gates: dict[str, asyncio.Event] = {}

    def script(self, name: str, *outcomes: object) -> None:
        self.outcomes[name].extend(outcomes)

    def release(self, name: str) -> None:
        self._gates.setdefault(name, asyncio.Event()).set()

    def prompts(self, agent_id: str) -> list[str]:
        return [r.prompt for r in self.requests if r.agent_id == agent_id]

    async def run_turn(self, request: TurnRequest) -> TurnResult:
        self.requests.append(request)
        name = request.spec.name
        queue = self.outcomes[name]
        outcome = queue.popleft() if queue else "ok"
        self.running.add(request.agent_id)
        try:
            if outcome == "hang":
                gate = self._gates.setdefault(name, asyncio.Event())
                await gate.wait()
                gate.clear()
                return TurnResult(output="released")
            if isinstance(outcome, BaseException):
                raise outcome
            if isinstance(outcome, TurnResult):
                return outcome
            return TurnResult(output=str(outcome))
        except asyncio.CancelledError:
            self.cancelled.append(request.agent_id)
            raise
        finally:
            self.running.discard(request.agent_id)

    async def reap(self, agent_id: str, state_dir: Path) -> bool:
        self.reaped.append(agent_id)
        return False


def fail(message: str = "boom", tokens: int = 0) -> TurnFailedError:
    return TurnFailedError(message, usage={"tokens": tokens, "costUsd": 0.0} if tokens else None)
