"""One turn of an agent in its own process: begun at the daemon, its usage counted here, ended
at the daemon (``POST /agents/{id}/turns/{n}/end``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from corral.client._errors import DaemonRefusedError, DaemonUnreachableError
from corral.kernel import CorralError, ExecutionBudget, InvalidArgumentError
from corral.kernel import _validate as v

logger = logging.getLogger("corral.client")

Json = dict[str, Any]
Ender = Callable[[int, Json], Awaitable[Json]]
"""``end(turn, body)``: posts a turn's end and answers the daemon's JSON."""

CANCELLED = "cancelled"
_MAX_CODE = 200


@dataclass(frozen=True, slots=True)
class TurnReport:
    """How the daemon settled a turn: ``outcome`` ``succeeded``, ``failed`` or
    ``interrupted`` (the agent was stopped or preempted while it ran, or the turn ran out of
    time first); ``error`` as its record shows it; what it counted (``tokens``,
    ``cost_usd``: None when unknown); and the agent as the outcome left it: ``agent_state``
    (``idle``; ``blocked`` when held -- ``agent_reason`` says why, ``circuit-tripped``,
    ``retries-exhausted``, ``budget-exhausted``, ``ask`` -- on ``decision``; ``failed``,
    ``stopped``)."""

    turn: int
    outcome: str
    error: str | None
    tokens: int
    cost_usd: float | None
    agent_state: str | None
    agent_reason: str | None
    decision: str | None

    @classmethod
    def of(cls, body: Json) -> TurnReport:
        usage: Json = body["usage"] if isinstance(body.get("usage"), dict) else {}
        agent: Json = body["agent"] if isinstance(body.get("agent"), dict) else {}
        return cls(
            turn=int(body.get("turn", 0)),
            outcome=str(body.get("outcome")),
            error=body.get("error"),
            tokens=int(usage.get("tokens") or 0),
            cost_usd=usage.get("costUsd"),
            agent_state=agent.get("state"),
            agent_reason=agent.get("reason"),
            decision=agent.get("decision"),
        )

    @property
    def held(self) -> bool:
        """Whether the outcome left the agent held for a person (it begins no turn until
        they answer)."""
        return self.agent_state == "blocked"


class Turn:
    """A turn the daemon opened for the agent (see :meth:`AgentHandle.begin`).

    ``number`` is its number, ``prompt`` what it was begun with, ``text`` the prompt with
    the notices that reached the agent since its last turn in front (what the agent should
    be given), ``retry`` whether it is the retry of a failed turn (``onFailure: retry``).
    ``timeout_s`` is how long the daemon waits for its end (time waiting on a person does
    not count) before failing it as timed out; ``remaining`` what is left of the agent's
    budget -- the tightest of its own and its ancestors' -- as the turn began (tokens,
    dollars, the deadline's seconds; None: unlimited).

    Record what the turn spends with :meth:`record`; set ``output`` (or pass it to
    :meth:`end`). End it with :meth:`end` or :meth:`fail`, once: a second end answers the
    first one's report. Not safe to share between threads; use it on one event loop.
    """

    def __init__(self, agent_id: str, prompt: str, begun: Json, ender: Ender) -> None:
        self.agent_id = agent_id
        self.number = int(begun["turn"])
        self.prompt = prompt
        self.text = str(begun.get("text") or prompt)
        self.retry = bool(begun.get("retry", False))
        self.timeout_s = float(begun.get("timeoutS") or 0.0)
        left: Json = begun["remaining"] if isinstance(begun.get("remaining"), dict) else {}
        self.remaining = ExecutionBudget(
            max_tokens=left.get("tokens"),
            max_cost_usd=left.get("costUsd"),
            deadline_s=left.get("deadlineS"),
        )
        self.output: str | None = None
        self._tokens = 0
        self._cost: float | None = 0.0
        self._ender = ender
        self._report: TurnReport | None = None
        self._ending: asyncio.Future[TurnReport] | None = None

    def __repr__(self) -> str:
        return f"Turn(agent_id={self.agent_id!r}, number={self.number}, ended={self.ended})"

    # --- usage ------------------------------------------------------------------------------

    def record(self, *, tokens: int = 0, cost_usd: float | None = 0.0) -> None:
        """Count ``tokens`` and ``cost_usd`` dollars more against the turn (sent with its end;
        counted against the agent's budget and its ancestors' then). ``cost_usd`` None: a
        cost nobody could price, and the turn's whole cost is unknown (a dollar budget
        cannot vouch for it). Raises ``InvalidArgumentError`` for a negative or non-whole
        ``tokens``, a negative or non-finite ``cost_usd``, and once the turn has ended."""
        where = "Turn.record"
        v.non_negative_int(where, "tokens", tokens)
        v.non_negative_number(where, "cost_usd", cost_usd, optional=True)
        if self.ended or self._ending is not None:
            raise InvalidArgumentError(where, "turn", "a turn that has not ended", self.number)
        self._tokens += tokens
        self._cost = None if cost_usd is None or self._cost is None else self._cost + cost_usd

    @property
    def tokens(self) -> int:
        """Tokens recorded so far."""
        return self._tokens

    @property
    def cost_usd(self) -> float | None:
        """Dollars recorded so far (None once a cost was unknown)."""
        return self._cost

    # --- ending -----------------------------------------------------------------------------

    @property
    def ended(self) -> bool:
        return self._report is not None

    @property
    def report(self) -> TurnReport | None:
        """How the daemon settled the turn, once it has ended."""
        return self._report

    async def end(self, output: str | None = None) -> TurnReport:
        """End the turn as done, with ``output`` (default: :attr:`output`, else empty) and
        the usage recorded. Answers how the daemon settled it (``interrupted`` when the agent
        was stopped meanwhile). Raises :class:`DaemonRefusedError` or
        :class:`DaemonUnreachableError` when the end could not be told (the daemon fails the
        turn once its time runs out)."""
        v.instance_of("Turn.end", "output", output, (str, type(None)))
        text = output if output is not None else self.output
        return await self._end({"outcome": "ok", "output": text or ""})

    async def fail(self, error: BaseException | str, *, code: str | None = None) -> TurnReport:
        """End the turn as failed: ``error`` is an exception (its ``code`` when it is a
        ``CorralError``, else its type's name, and its message) or a message; ``code``
        overrides. The daemon applies the agent's failure policy. Raises as :meth:`end`."""
        v.instance_of("Turn.fail", "error", error, (BaseException, str))
        v.non_empty_str("Turn.fail", "code", code, optional=True)
        return await self._end({"outcome": "failed", "error": error_body(error, code)})

    async def _end(self, body: Json) -> TurnReport:
        if self._report is not None:
            return self._report
        if self._ending is None:
            body["usage"] = {"tokens": self._tokens, "costUsd": self._cost}
            self._ending = asyncio.ensure_future(self._send(body))
            # Its failure is the waiter's to raise; one nobody waits for any more is dropped.
            self._ending.add_done_callback(_retrieve)
        # Shielded: an end that was sent is seen through, whoever waited on it is cancelled.
        return await asyncio.shield(self._ending)

    async def _send(self, body: Json) -> TurnReport:
        try:
            self._report = TurnReport.of(await self._ender(self.number, body))
        except BaseException:
            self._ending = None  # not told: it may be ended again
            raise
        return self._report


def _retrieve(future: asyncio.Future[TurnReport]) -> None:
    if not future.cancelled():
        future.exception()


def error_body(error: BaseException | str, code: str | None) -> Json:
    """A failed turn's ``error`` as the daemon takes it: ``{code, message}``."""
    if isinstance(error, str):
        message = error
        found = code
    else:
        message = str(error) or type(error).__name__
        found = code or (error.code if isinstance(error, CorralError) else type(error).__name__)
    return {
        "code": (found or "turn_failed")[:_MAX_CODE],
        "message": message or "the turn failed",
    }


class TurnScope:
    """``async with handle.turn(prompt) as turn``: begins the turn on entry and ends it on
    exit -- done (with ``turn.output``) when the block ends normally, failed when it raises
    (the exception's code and message; the exception then propagates as it was), failed with
    code ``cancelled`` when it is cancelled (``asyncio.CancelledError`` propagates
    untouched). An end that cannot be told is raised after a normal exit, and only logged
    when the block raised (its own exception wins). ``KeyboardInterrupt`` and
    ``SystemExit`` propagate without an end: the daemon fails the turn when its time runs
    out."""

    def __init__(self, begin: Callable[[], Awaitable[Turn]]) -> None:
        self._begin = begin
        self.turn: Turn | None = None

    async def __aenter__(self) -> Turn:
        self.turn = await self._begin()
        return self.turn

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        turn = self.turn
        assert turn is not None
        if exc is None:
            if not turn.ended:
                await turn.end()
            return False
        if turn.ended or not isinstance(exc, Exception | asyncio.CancelledError):
            return False
        try:
            if isinstance(exc, asyncio.CancelledError):
                await turn.fail("the turn was cancelled in the agent's process", code=CANCELLED)
            else:
                await turn.fail(exc)
        except (DaemonRefusedError, DaemonUnreachableError, asyncio.CancelledError) as failed:
            logger.warning(
                "agent %s: turn %d's failure was not told to the daemon: %s",
                turn.agent_id,
                turn.number,
                failed,
            )
        return False
