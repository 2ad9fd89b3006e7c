"""The harness seam: what runs one turn of an agent."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from corral.daemon._records import SessionMessage
from corral.daemon._spec import AgentSpec
from corral.kernel import ActionCheck, CorralError, ExecutionBudget


@dataclass(frozen=True, slots=True, kw_only=True)
class ExtraTool:
    """A tool the daemon hands a turn on top of the spec's own (corral's tools, scoped by the
    agent's token; see ``openai.corralTools``).

    ``name`` is what the model calls, ``description`` what it is told, ``parameters`` the
    JSON Schema (an object) of its arguments. ``call(arguments)`` runs it with the model's
    arguments (a JSON object) and returns the result the model reads; it raises
    :class:`corral.agent.ToolError` to tell the model a call was refused or went wrong (the
    turn goes on). A harness that gives its model tools offers these too, each call checked
    with ``check_action`` like its own; the others ignore them.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    call: Callable[[dict[str, Any]], Awaitable[str]]


class TurnOutput(Protocol):
    """Where a harness puts what a turn prints and logs as it comes (the daemon's capped
    per-turn log, see ``corral.daemon._turn_log``): ``write(stream, data)`` with a stream
    name (``stdout``, ``stderr``, ``log``, ``model``, ``tool``) and bytes or text, cut into
    lines there; ``add_dropped(count)`` counts bytes the harness dropped itself before they
    could reach it. Both are cheap, called on the event loop, and never raise."""

    def write(self, stream: str, data: bytes | str) -> None: ...

    def add_dropped(self, count: int) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnRequest:
    """One turn to run.

    ``workdir`` is the agent's own working directory (it lives as long as the agent);
    ``state_dir`` is a directory the harness may use for its own bookkeeping (a pid file),
    private to this agent and outside ``workdir``. ``env`` holds what the agent is told
    about itself (``CORRAL_AGENT_ID``, ``CORRAL_URL``, ...) on top of the spec's ``env``.
    ``remaining`` is what is left of the agent's budget (None dimensions are unlimited);
    a harness that makes model calls must not spend past it.

    ``check_action`` is the daemon's check of an action of this agent (its guardrails):
    ``check_action(agent_id, action, context)``, plain or async, answers something with
    ``allowed`` (a bool) and ``reason``; it may take long, when a rule asks a person and
    waits for the answer. A harness that acts for the agent (the ``openai`` harness's tool
    calls) puts every action through it when it is given; None means nothing is checked.

    ``paused_s()`` is how many seconds this turn has spent waiting on a person so far, a
    wait in progress included (it grows while the turn waits), None when the daemon does
    not tell. That time does not count against ``timeout_s``: a turn is cut short when its
    own time -- time gone by less ``paused_s()`` -- passes ``timeout_s``, and the approval's
    own timeout decides how long a wait may be (see ``TurnTimer``). It must only grow,
    never raise, and be cheap: harnesses read it whenever they check their time limit.

    ``heartbeat()`` tells the daemon the turn shows a sign of life (the spec's
    ``heartbeatS``: a turn silent for longer is stalled); None when nothing watches the turn.
    A harness calls it, on the event loop, whenever it sees one: the ``command`` and
    ``python`` harnesses when the agent touches its heartbeat file (``CORRAL_HEARTBEAT_FILE``,
    see ``_liveness``) or, for a command, writes output; the ``openai`` harness at each model
    call and tool call. It is cheap and never raises.

    ``extra_tools`` are tools the daemon adds for this agent (see :class:`ExtraTool`).

    ``spent(usage)`` is how a harness whose turn is cancelled (the agent stopped, preempted,
    its stalled turn restarted) tells the daemon what the turn had spent so far
    (``{"tokens", "costUsd"}``, ``costUsd`` None when unknown), so that it still counts
    against the agent's and its ancestors' budgets; called at most once, before the
    cancellation propagates, never raising. None when the daemon does not ask. A harness
    that cannot know (a command, a python function: they report usage only with their
    result) does not call it.

    ``log`` is where the turn's output and log records go as they come (see
    :class:`TurnOutput`); None when the daemon does not keep them.

    ``session`` is the agent's conversation before this turn, oldest first (empty when its
    ``history`` is ``none``; see ``corral.daemon._sessions``): the ``command`` harness writes
    it to ``CORRAL_SESSION_FILE``, the ``python`` harness puts it in its context, the
    ``openai`` harness sends it to the model before ``prompt``.
    """

    agent_id: str
    turn: int
    prompt: str
    spec: AgentSpec
    workdir: Path
    state_dir: Path
    env: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 600.0
    remaining: ExecutionBudget = field(default_factory=ExecutionBudget)
    check_action: ActionCheck | None = None
    paused_s: Callable[[], float] | None = None
    heartbeat: Callable[[], None] | None = None
    extra_tools: tuple[ExtraTool, ...] = ()
    spent: Callable[[Mapping[str, Any]], None] | None = None
    session: tuple[SessionMessage, ...] = ()
    log: TurnOutput | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnResult:
    """A successful turn: its output and what it spent (``cost_usd`` None when unknown).

    ``messages`` are what the agent said in the turn, for its session, when it said more
    than its output (the ``openai`` harness: each model reply with its ``toolCalls``, each
    tool result, the final answer; see :class:`SessionMessage` for the keys); empty, the
    session keeps ``output`` as the turn's answer.
    """

    output: str
    tokens: int = 0
    cost_usd: float | None = 0.0
    messages: tuple[Mapping[str, Any], ...] = ()


class TurnFailedError(CorralError):
    """A turn failed. ``message`` is what the agent's record and events show as the error.

    ``usage`` (``{"tokens", "costUsd"}``) is what the failed turn spent, when known.
    ``dimension`` names the budget dimension (``tokens``, ``cost_usd``, ``deadline_s``) the
    turn stopped on, when it stopped because its budget had no room left: the daemon then
    holds the agent ``budget-exhausted``, whatever its failure policy. ``messages`` are what
    the agent said in the turn before it failed, as :attr:`TurnResult.messages`.
    """

    code = "turn_failed"

    def __init__(
        self,
        message: str,
        *,
        usage: Mapping[str, Any] | None = None,
        dimension: str | None = None,
        messages: Sequence[Mapping[str, Any]] = (),
        **details: Any,
    ):
        if dimension is not None:
            details["dimension"] = dimension
        super().__init__(message, **details)
        self.usage = dict(usage) if usage else None
        self.dimension = dimension
        self.messages = tuple(messages)


@runtime_checkable
class Harness(Protocol):
    """Runs turns of one kind of agent.

    ``run_turn`` returns a :class:`TurnResult` or raises :class:`TurnFailedError` (a timeout
    is a failed turn too). When the task running it is cancelled (the agent is stopped, the
    daemon shuts down) it must end what it started (kill its process) and let
    ``asyncio.CancelledError`` through. ``reap`` is called once at daemon start for an agent
    whose turn was in flight when the daemon died: it ends any leftover process of that turn
    and says whether it found one. Both must be safe to call for any agent of the harness.
    """

    async def run_turn(self, request: TurnRequest) -> TurnResult: ...

    async def reap(self, agent_id: str, state_dir: Path) -> bool: ...


@runtime_checkable
class WarmHarness(Protocol):
    """A harness that keeps something per agent between its turns (a worker process).

    The service calls ``release`` once an agent has ended (stopped, failed), after its turn
    is over, and ``aclose`` when it shuts down; both end what is kept and must be safe to
    call for any agent, and more than once.
    """

    async def release(self, agent_id: str) -> None: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class TerminatingHarness(Protocol):
    """A harness whose turns can be asked to end before they are killed (a graceful stop).

    ``terminate`` asks the agent's turn in flight to end by itself -- SIGTERM to the
    processes it runs (the command's process group, the python worker) -- and returns at
    once, True when there was a process to ask. The turn's task then ends on its own
    (its outcome is dropped: the agent is stopped); when it has not within the stop's
    grace, the daemon cancels it, which kills as ``run_turn`` says. Safe to call for any
    agent of the harness, and more than once. A harness without it (``openai``: its model
    call is only waited on) is cancelled at once.
    """

    async def terminate(self, agent_id: str, state_dir: Path) -> bool: ...


class NothingToAdoptError(CorralError):
    """:meth:`AdoptingHarness.adopt` found no turn to adopt: its process is gone and left no
    outcome (or never ran). Whatever it left was ended; the daemon settles the turn as
    interrupted."""

    code = "nothing_to_adopt"


@runtime_checkable
class AdoptingHarness(Harness, Protocol):
    """A harness whose turns can outlive the daemon and be taken up by the next one.

    ``adopt`` is called at daemon start, instead of ``reap``, for a turn that was waiting on a
    person when the daemon died (the agent's state ``waiting``): it waits for that turn's
    leftover process to finish and returns its outcome as ``run_turn`` would have --
    :class:`TurnResult`, or :class:`TurnFailedError` -- honouring ``request.timeout_s`` with
    ``request.paused_s`` (its clock starts at the adoption). ``request.prompt`` is not used:
    the turn has its prompt already. Raises :class:`NothingToAdoptError` when there is
    nothing to adopt (the process is gone and left no outcome), once whatever the turn left
    is ended. A cancellation ends the process and propagates, as for ``run_turn``.
    """

    async def adopt(self, request: TurnRequest) -> TurnResult: ...
