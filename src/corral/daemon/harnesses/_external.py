"""The ``external`` harness: turns of an agent that runs in its own process.

The daemon runs nothing for such an agent. Its process begins a turn (``POST
/agents/{id}/turns``), which the service starts like any turn -- so the turn task, the turn
record, the events and the settlement are the ones every harness has -- and
:meth:`ExternalHarness.run_turn` waits for the process to report how the turn ended
(:meth:`ExternalHarness.report`, from ``POST /agents/{id}/turns/{n}/end``). What it reported
is the turn's outcome, exactly as another harness's result would be: a :class:`TurnResult`,
or a :class:`TurnFailedError` raised.

A turn not reported within ``request.timeout_s`` of its own time (time waiting on a person
does not count, as for every harness: :class:`TurnTimer`) fails as timed out: a process that
died mid-turn leaves no agent running for ever. A cancelled turn (the agent stopped,
preempted) ends here; a report that comes after it finds nothing open.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from corral.daemon.harnesses._base import TurnFailedError, TurnRequest, TurnResult
from corral.daemon.harnesses._timer import TurnTimer
from corral.kernel import SYSTEM_CLOCK, Clock
from corral.kernel import _validate as v

__all__ = ["ExternalHarness", "Reported"]

Reported = TurnResult | TurnFailedError
"""What an agent's process reports of a turn: its result, or the failure to raise."""


@dataclass(slots=True)
class _Open:
    turn: int
    reported: asyncio.Future[Reported]


class ExternalHarness:
    """Waits for the turns of ``external`` agents to be reported by their processes (see the
    module docstring). ``clock`` times their limit. It is an adopting harness: a daemon that
    restarts while such a turn is open takes it up and waits for the report again (the
    process retries its report meanwhile), its time limit starting anew."""

    def __init__(self, *, clock: Clock = SYSTEM_CLOCK) -> None:
        v.instance_of("ExternalHarness", "clock", clock, Clock)
        self.clock = clock
        self._open: dict[str, _Open] = {}

    async def run_turn(self, request: TurnRequest) -> TurnResult:
        return await self._wait(request)

    async def adopt(self, request: TurnRequest) -> TurnResult:
        return await self._wait(request)

    async def reap(self, agent_id: str, state_dir: Path) -> bool:
        return False  # the daemon started no process for it

    def expect(self, agent_id: str, turn: int) -> None:
        """Open turn ``turn`` of ``agent_id`` for its report now, as it begins (before its
        task runs :meth:`run_turn`): a report that comes at once is kept for it."""
        found = self._open.get(agent_id)
        if found is None or found.turn != turn:
            loop = asyncio.get_running_loop()
            self._open[agent_id] = _Open(turn, loop.create_future())

    def report(self, agent_id: str, turn: int, outcome: Reported) -> bool:
        """Hand the outcome of turn ``turn`` of ``agent_id`` to the turn waiting for it;
        False (nothing done) when that turn is not waiting here: never begun, ended
        already (reported, timed out, cancelled), or reported a moment ago."""
        found = self._open.get(agent_id)
        if found is None or found.turn != turn or found.reported.done():
            return False
        found.reported.set_result(outcome)
        return True

    def is_open(self, agent_id: str, turn: int) -> bool:
        """Whether turn ``turn`` of ``agent_id`` waits for its report here."""
        found = self._open.get(agent_id)
        return found is not None and found.turn == turn and not found.reported.done()

    async def _wait(self, request: TurnRequest) -> TurnResult:
        self.expect(request.agent_id, request.turn)
        opened = self._open[request.agent_id]
        timer = TurnTimer(request.timeout_s, request.paused_s, clock=self.clock)
        try:
            if not await timer.wait(opened.reported):
                raise TurnFailedError(
                    f"{timer.timeout_message()}: its process did not report how it ended",
                    timeout_s=request.timeout_s,
                )
        finally:
            if self._open.get(request.agent_id) is opened:
                del self._open[request.agent_id]
        outcome = opened.reported.result()
        if isinstance(outcome, TurnFailedError):
            raise outcome
        return outcome
