"""One turn of an agent: the request its harness gets, and what the harness reports."""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from corral.daemon import _budget, _tree_budget
from corral.daemon._auth import agent_token
from corral.daemon._records import AgentRecord, SessionMessage
from corral.daemon._spec import AgentSpec
from corral.daemon._text import escape, escape_json
from corral.daemon.harnesses import (
    AdoptingHarness,
    ExtraTool,
    Harness,
    NothingToAdoptError,
    TurnFailedError,
    TurnRequest,
    TurnResult,
)
from corral.daemon.harnesses._base import TurnOutput
from corral.kernel import ActionCheck

logger = logging.getLogger("corral.daemon")


def agent_env(rec: AgentRecord, url: str, token: str | None) -> dict[str, str]:
    """What the agent is told about itself; with the daemon's ``token``, a token scoped to
    the agent and its descendants."""
    env = {
        "CORRAL_AGENT_ID": rec["id"],
        "CORRAL_AGENT_NAME": rec["name"],
        "CORRAL_RUN_ID": rec["runId"],
        "CORRAL_URL": url,
    }
    if rec["parent"] is not None:
        env["CORRAL_PARENT_ID"] = rec["parent"]
    if token is not None:
        env["CORRAL_TOKEN"] = agent_token(token, rec["id"])
    return env


def request(
    rec: AgentRecord,
    spec: AgentSpec,
    turn: int,
    prompt: str,
    now: datetime,
    *,
    home: Path,
    env: dict[str, str],
    check_action: ActionCheck | None = None,
    paused_s: Callable[[], float] | None = None,
    lookup: _tree_budget.Lookup | None = None,
    heartbeat: Callable[[], None] | None = None,
    extra_tools: Sequence[ExtraTool] = (),
    session: Sequence[SessionMessage] = (),
    spent: Callable[[Mapping[str, Any]], None] | None = None,
    log: TurnOutput | None = None,
) -> TurnRequest:
    """Turn ``turn`` of the agent, with what is left of its budget at ``now`` (and of each
    ancestor's, found with ``lookup``: the tightest of them), the action check its harness
    asks before each tool call, how long it has waited on people, what its harness calls on
    each sign of life (``heartbeat``, see ``_stall``), the tools the daemon adds to its
    spec's (``extra_tools``), its ``session`` before this turn, and where a cancelled turn
    tells what it spent (``spent``), and where its output and logs go (``log``)."""
    own = _budget.in_force(rec, spec).to_budget()
    remaining = _tree_budget.remaining(rec, own, lookup or _no_agent, now)
    timeout_s = spec.turn_timeout_s
    if remaining.deadline_s is not None and remaining.deadline_s < timeout_s:
        # A turn may not outlive the agent's deadline: it is cut short (a failed turn). The
        # deadline is wall time, so waiting on a person does not move it.
        timeout_s = max(0.001, remaining.deadline_s)
        paused_s = None
    return TurnRequest(
        agent_id=rec["id"],
        turn=turn,
        prompt=prompt,
        spec=spec,
        workdir=workdir(home, rec["id"]),
        state_dir=state_dir(home, rec["id"]),
        env=env,
        timeout_s=timeout_s,
        remaining=remaining,
        check_action=check_action,
        paused_s=paused_s,
        heartbeat=heartbeat,
        extra_tools=tuple(extra_tools),
        session=tuple(session),
        spent=spent,
        log=log,
    )


def _no_agent(agent_id: str) -> AgentRecord | None:
    return None


def workdir(home: Path, agent_id: str) -> Path:
    """The agent's working directory: it lives as long as the agent."""
    return _agent_dirs(home, agent_id)[0]


def state_dir(home: Path, agent_id: str) -> Path:
    """The harness's bookkeeping for the agent, outside its working directory."""
    return _agent_dirs(home, agent_id)[1]


@functools.lru_cache(maxsize=4096)
def _agent_dirs(home: Path, agent_id: str) -> tuple[Path, Path]:
    """The agent's working and state directories (paths only: nothing is looked at), kept
    for the agents of recent turns, as each turn asks for them a few times and making a
    path costs more than a dict look-up."""
    agent = home.joinpath("agents", agent_id)
    return agent / "work", agent / "state"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a turn came to: a ``result``, or an ``error`` with what it spent (``usage``) and,
    when it stopped on its budget, the budget ``dimension``, and what it said before it
    failed (``messages``); or, for a turn taken up after a restart, ``interrupted``: nothing
    of it was left to adopt."""

    result: TurnResult | None = None
    error: str | None = None
    usage: dict[str, Any] | None = None
    dimension: str | None = None
    interrupted: bool = False
    messages: tuple[Mapping[str, Any], ...] = ()


async def run(harness: Harness, turn: TurnRequest) -> Outcome:
    """Run the turn; a harness that raises anything but :class:`TurnFailedError` (a bug)
    fails the turn too, and is logged.

    What the harness reports is escaped (``_text.escape``: lone surrogates and NUL become
    U+FFFD), so whatever an agent returns can be stored and read back."""
    return await _outcome(turn, harness.run_turn(turn), adopting=False)


async def adopt(harness: AdoptingHarness, turn: TurnRequest) -> Outcome:
    """Take up a turn a previous daemon left waiting (see :class:`AdoptingHarness`): its
    outcome as :func:`run` gives it, or ``interrupted`` when there was nothing to adopt."""
    return await _outcome(turn, harness.adopt(turn), adopting=True)


async def _outcome(turn: TurnRequest, work: Awaitable[TurnResult], *, adopting: bool) -> Outcome:
    try:
        result = await work
    except TurnFailedError as exc:
        error = escape(exc.message)
        usage = None if exc.usage is None else escape_json(dict(exc.usage))
        problem = (
            None
            if usage is None
            else usage_problem(usage.get("tokens", 0), usage.get("costUsd", 0.0))
        )
        if problem is not None:
            # An agent reports its own usage: what cannot be counted is not (NaN would poison
            # every read of the record, a negative count every later budget check).
            error, usage = f"{error}; its usage was not counted: {problem}", None
        return Outcome(
            error=error,
            usage=usage,
            dimension=_dimension(turn, exc),
            messages=getattr(exc, "messages", ()),
        )
    except Exception as exc:
        if adopting and isinstance(exc, NothingToAdoptError):
            logger.info("agent %s: turn %d: %s", turn.agent_id, turn.turn, exc.message)
            return Outcome(interrupted=True)
        logger.exception("agent %s: harness %s raised", turn.agent_id, turn.spec.harness)
        return Outcome(error=escape(f"harness error: {type(exc).__name__}: {exc}"))
    problem = usage_problem(result.tokens, result.cost_usd)
    if problem is not None:
        return Outcome(error=f"the turn reported a usage that cannot be counted: {problem}")
    return Outcome(result=replace(result, output=escape(result.output)))


MAX_TOKENS = 2**53  # past any real count, and exact in a JSON number


def usage_problem(tokens: Any, cost_usd: Any) -> str | None:
    """Why a turn's reported usage cannot be counted (tokens a whole number from 0 to 2**53,
    cost a finite number >= 0 or None for unknown), or None when it can."""
    if type(tokens) is not int or not 0 <= tokens <= MAX_TOKENS:
        return f"tokens must be a whole number from 0 to 2**53, got {_shown(tokens)}"
    kind = type(cost_usd)
    if cost_usd is not None and (
        kind not in (int, float) or not math.isfinite(cost_usd) or cost_usd < 0
    ):
        return f"costUsd must be a finite number >= 0 or null, got {_shown(cost_usd)}"
    return None


def _shown(value: Any) -> str:
    if type(value) is int and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"  # repr() refuses 4,300+ digits
    return escape(repr(value)[:40])


def _dimension(turn: TurnRequest, exc: TurnFailedError) -> str | None:
    """The budget dimension a failed turn stopped on: the harness's word, or the deadline
    when the turn timed out and its timeout was the agent's deadline (see :func:`request`)."""
    deadline = turn.remaining.deadline_s
    timed_out = "timeout_s" in exc.details
    if exc.dimension is None and timed_out and deadline is not None:
        return "deadline_s" if deadline <= turn.spec.turn_timeout_s else None
    return exc.dimension
