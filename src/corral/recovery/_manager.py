"""``RecoveryManager``: watches agent health and takes recovery actions by policy."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import math
import threading
from collections import deque
from collections.abc import Mapping

from corral.guard import AgentGroup, Supervisor
from corral.guard._group import unknown_member
from corral.kernel import SYSTEM_CLOCK, Clock, InvalidArgumentError, UsageError
from corral.kernel import _validate as v
from corral.recovery._checks import CheckRunner, CheckUnanswered
from corral.recovery._types import (
    LISTENER_METHODS,
    HealthCheck,
    HealthStatus,
    RecoveryAction,
    RecoveryPolicy,
    RecoveryResult,
    RestartHook,
)

logger = logging.getLogger("corral.recovery")

_REMOVING = (RecoveryAction.EJECT, RecoveryAction.REPLACE)
_RESTARTING = (RecoveryAction.RESTART, RecoveryAction.RESTART_CLEAN)


class RecoveryManager:
    """Runs health checks on the agents of a supervisor's group and recovers failing ones.

    A failed or raising health check, or :meth:`trigger_recovery`, starts an attempt: inside
    the cooldown of the agent's previous attempt nothing happens and a failed result returns;
    otherwise the policy picks the action from the retry count, the count goes up by one, the
    action is taken, and the result goes to the history and to the listeners. The decision is
    atomic per agent, so attempts racing from several tasks or threads never share a count.
    The retry count is not reset when an agent is healthy again: :meth:`reset_retry_counter`.

    ``max_history`` (an integer >= 1) caps the history: the oldest results are dropped first.
    ``check_timeout_s`` (seconds of ``clock``, a finite number > 0, or None for no limit) bounds
    each health check: one that has not answered by then is a failed check whose reason says it
    timed out, and recovery starts as for any failure. An async check (a coroutine function, or
    an object with an async ``__call__``) runs on the event loop and is cancelled at the
    timeout. Any other check is called in a worker thread, with or without a timeout, so a
    blocking one freezes neither the loop nor the other checks; it must therefore not touch the
    event loop (make it async for that). A thread cannot be interrupted: at the timeout it is
    left to finish, its answer is dropped, and until it has finished that agent's check is not
    started again and each run reports it as still hung. Raises ``InvalidArgumentError`` for
    bad arguments.
    """

    def __init__(
        self,
        supervisor: Supervisor,
        policy: RecoveryPolicy = RecoveryPolicy(),  # noqa: B008 - frozen, shared safely
        *,
        restart_hook: RestartHook | None = None,
        clock: Clock = SYSTEM_CLOCK,
        max_history: int = 1000,
        check_timeout_s: float | None = 10.0,
    ) -> None:
        where = "RecoveryManager"
        v.instance_of(where, "supervisor", supervisor, Supervisor)
        v.instance_of(where, "policy", policy, RecoveryPolicy)
        if restart_hook is not None:
            v.callable_(where, "restart_hook", restart_hook)
        v.instance_of(where, "clock", clock, Clock)
        v.positive_int(where, "max_history", max_history)
        v.positive_number(where, "check_timeout_s", check_timeout_s, optional=True)
        self._supervisor = supervisor
        self._group: AgentGroup = supervisor.group
        self._policy = policy
        self._restart_hook = restart_hook
        self._clock = clock
        self._lock = threading.Lock()
        self._checks: dict[str, HealthCheck] = {}
        self._counts: dict[str, int] = {}
        self._last_attempt: dict[str, float] = {}
        self._history: deque[RecoveryResult] = deque(maxlen=max_history)
        self._checker = CheckRunner(
            clock, None if check_timeout_s is None else float(check_timeout_s)
        )
        self._listeners: tuple[object, ...] = ()
        self._task: asyncio.Task[None] | None = None

    @property
    def supervisor(self) -> Supervisor:
        return self._supervisor

    @property
    def policy(self) -> RecoveryPolicy:
        return self._policy

    @property
    def max_history(self) -> int:
        """How many results the history keeps at most."""
        maxlen = self._history.maxlen
        assert maxlen is not None
        return maxlen

    @property
    def check_timeout_s(self) -> float | None:
        """Seconds each health check may take (None: no limit)."""
        return self._checker.timeout_s

    # --- registration ---------------------------------------------------------------------

    def add_health_check(self, agent_id: str, check: HealthCheck) -> None:
        """Check ``agent_id`` with ``check``, replacing its previous check.

        Raises ``UnknownAgentError`` when the agent is not in the group and
        ``InvalidArgumentError`` when ``check`` is not callable.
        """
        v.non_empty_str("RecoveryManager.add_health_check", "agent_id", agent_id)
        v.callable_("RecoveryManager.add_health_check", "check", check)
        self._group.require(agent_id)
        with self._lock:
            self._checks[agent_id] = check

    def remove_health_check(self, agent_id: str) -> bool:
        """Stop checking ``agent_id``; whether it had a check."""
        v.non_empty_str("RecoveryManager.remove_health_check", "agent_id", agent_id)
        with self._lock:
            return self._checks.pop(agent_id, None) is not None

    @property
    def health_checks(self) -> Mapping[str, HealthCheck]:
        """A copy of the registered checks by agent id."""
        with self._lock:
            return dict(self._checks)

    def add_listener(self, listener: object) -> None:
        """Tell ``listener`` about failed checks, attempts and escalations.

        Raises ``InvalidArgumentError`` when it has none of ``on_health_check_failed``,
        ``on_recovery_attempt``, ``on_escalation`` as a callable.
        """
        if not any(callable(getattr(listener, m, None)) for m in LISTENER_METHODS):
            raise InvalidArgumentError(
                "RecoveryManager.add_listener",
                "listener",
                "an object with on_health_check_failed, on_recovery_attempt or on_escalation",
                listener,
            )
        with self._lock:
            self._listeners = (*self._listeners, listener)

    def remove_listener(self, listener: object) -> bool:
        """Stop telling ``listener``; whether it was listening."""
        with self._lock:
            kept = tuple(item for item in self._listeners if item is not listener)
            removed = len(kept) != len(self._listeners)
            self._listeners = kept
        return removed

    # --- counts and history ---------------------------------------------------------------

    def retry_count(self, agent_id: str) -> int:
        """Recovery attempts made for ``agent_id`` since its last reset (0 for unknown ids)."""
        v.non_empty_str("RecoveryManager.retry_count", "agent_id", agent_id)
        with self._lock:
            return self._counts.get(agent_id, 0)

    def reset_retry_counter(self, agent_id: str) -> None:
        """Set ``agent_id``'s retry count back to 0 (the cooldown still runs). Idempotent."""
        v.non_empty_str("RecoveryManager.reset_retry_counter", "agent_id", agent_id)
        with self._lock:
            self._counts.pop(agent_id, None)

    @property
    def history(self) -> list[RecoveryResult]:
        """A copy of the attempts' results, oldest first: the newest ``max_history`` of them.

        Cooldown skips are not kept.
        """
        with self._lock:
            return list(self._history)

    # --- checks and recovery --------------------------------------------------------------

    async def run_health_checks(self) -> dict[str, HealthStatus]:
        """Run every check once, concurrently, and recover the agents that fail.

        Agents no longer in the group are skipped (absent from the answer; their checks stay
        registered). A check that raises, or answers anything but True, is a failure; so is a
        check that ends in ``asyncio.CancelledError`` of its own, and one that does not answer
        within ``check_timeout_s`` (the other checks are not held up by it). Cancelling the
        caller still cancels the run, and the async checks with it.
        """
        with self._lock:
            checks = list(self._checks.items())
        statuses = await asyncio.gather(*(self._check_one(a, c) for a, c in checks))
        return {status.agent_id: status for status in statuses if status is not None}

    async def trigger_recovery(self, agent_id: str, reason: str) -> RecoveryResult:
        """Start a recovery attempt for ``agent_id`` now, because of ``reason``.

        Raises ``UnknownAgentError`` when the agent is not in the group.
        """
        v.non_empty_str("RecoveryManager.trigger_recovery", "agent_id", agent_id)
        v.non_empty_str("RecoveryManager.trigger_recovery", "reason", reason)
        result = await self._attempt(agent_id, reason, strict=True)
        assert result is not None  # strict attempts raise instead of returning None
        return result

    async def _check_one(self, agent_id: str, check: HealthCheck) -> HealthStatus | None:
        agent = self._group.get(agent_id)
        if agent is None:
            return None
        reason: str | None
        try:
            outcome = await self._checker.run(agent_id, check, agent)
            if outcome is True:
                reason = None
            elif outcome is False:
                reason = "health check returned False"
            else:
                reason = f"health check returned {outcome!r}, not a bool"
        except CheckUnanswered as unanswered:
            reason = unanswered.reason
        except Exception as exc:
            logger.warning("health check of agent %r raised", agent_id, exc_info=True)
            reason = f"health check raised {type(exc).__name__}: {exc}"
        except asyncio.CancelledError:
            if _cancelled_from_outside():
                raise
            logger.warning("health check of agent %r was cancelled from inside", agent_id)
            reason = "health check was cancelled"
        status = HealthStatus(
            agent_id=agent_id, healthy=reason is None, reason=reason, checked_at=self._clock.now()
        )
        if reason is None:
            return status
        logger.warning("agent %r is unhealthy: %s", agent_id, reason)
        await self._notify("on_health_check_failed", status)
        recovery = await self._attempt(agent_id, reason, strict=False)
        return dataclasses.replace(status, recovery=recovery)

    async def _attempt(self, agent_id: str, reason: str, *, strict: bool) -> RecoveryResult | None:
        policy = self._policy
        with self._lock:
            now = self._clock.monotonic()
            agent = self._group.get(agent_id)
            if agent is None:
                if strict:
                    raise unknown_member(agent_id, self._group.name, len(self._group))
                return None
            count = self._counts.get(agent_id, 0)
            last = self._last_attempt.get(agent_id)
            if last is not None and now - last < policy.cooldown_s:
                return RecoveryResult(
                    agent_id=agent_id,
                    action_taken=None,
                    success=False,
                    reason=reason,
                    detail=(
                        f"in cooldown: {now - last:g} s since the previous attempt, "
                        f"cooldown is {policy.cooldown_s:g} s; nothing done"
                    ),
                    attempt=count,
                    attempted_at=self._clock.now(),
                )
            action = policy.action_for(count)
            attempt = count + 1
            self._counts[agent_id] = attempt
            self._last_attempt[agent_id] = now
            if action in _REMOVING:
                # The decision and the removal happen together so no racing attempt sees a
                # half-removed agent.
                self._group.remove(agent_id)
                self._checks.pop(agent_id, None)
                self._counts.pop(agent_id, None)
                self._last_attempt.pop(agent_id, None)
        success, detail = await self._act(agent_id, agent, action, count)
        result = RecoveryResult(
            agent_id=agent_id,
            action_taken=action,
            success=success,
            reason=reason,
            detail=detail,
            attempt=attempt,
            attempted_at=self._clock.now(),
        )
        with self._lock:
            self._history.append(result)
        logger.info("recovery of agent %r: %s (%s)", agent_id, action.value, detail)
        await self._notify("on_recovery_attempt", result)
        return result

    async def _act(
        self, agent_id: str, agent: object, action: RecoveryAction, count: int
    ) -> tuple[bool, str]:
        if action is RecoveryAction.EJECT:
            return True, (
                f"removed from group {self._group.name!r} after {count} attempts "
                f"(max_retries {self._policy.max_retries})"
            )
        if action is RecoveryAction.REPLACE:
            return True, (
                f"removed from group {self._group.name!r}; adding a replacement is the "
                "caller's to do"
            )
        if action is RecoveryAction.ESCALATE:
            await self._notify("on_escalation", agent_id, count)
            return True, (
                f"escalated after {count} attempts (escalate_after {self._policy.escalate_after})"
            )
        assert action in _RESTARTING
        hook = self._restart_hook
        if hook is None:
            return True, f"{action.value} requested; no restart hook, nothing changed"
        try:
            outcome = hook(agent_id, agent, action)
            if inspect.isawaitable(outcome):
                await outcome
        except Exception as exc:
            logger.exception("restart hook failed for agent %r (%s)", agent_id, action.value)
            return False, f"restart hook failed: {type(exc).__name__}: {exc}"
        return True, f"{action.value} done by the restart hook"

    async def _notify(self, method: str, *args: object) -> None:
        for listener in self._listeners:
            fn = getattr(listener, method, None)
            if not callable(fn):
                continue
            try:
                outcome = fn(*args)
                if inspect.isawaitable(outcome):
                    await outcome
            except Exception:
                logger.exception("recovery listener %r failed in %s", listener, method)

    # --- background loop ------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether the background checks are running."""
        return self._task is not None and not self._task.done()

    def start(self, interval_s: float) -> None:
        """Run every check each ``interval_s`` seconds (of the clock) until :meth:`stop`.

        The first run is one interval after the start; the rate is fixed (a slow run skips
        the ticks it overran rather than bunching them). Needs a running event loop. Raises
        ``UsageError`` when already running or called outside an event loop, and
        ``InvalidArgumentError`` when ``interval_s`` is not a finite number > 0.
        """
        v.positive_number("RecoveryManager.start", "interval_s", interval_s)
        if self.running:
            raise UsageError(
                "RecoveryManager.start: the health checks are already running; stop() first",
                interval_s=interval_s,
            )
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise UsageError(
                "RecoveryManager.start: needs a running event loop, and none is running",
                interval_s=interval_s,
            ) from None
        interval = float(interval_s)
        first_at = self._clock.monotonic() + interval
        self._task = loop.create_task(self._run(interval, first_at), name="corral-recovery")

    async def stop(self) -> None:
        """Stop the background checks and wait until they have. Idempotent."""
        task, self._task = self._task, None
        if task is None or task.done():
            return
        task.cancel()
        if task is asyncio.current_task():
            return  # stop() from a listener inside the loop: the cancel ends it
        # wait() does not raise the task's cancellation, only our own.
        await asyncio.wait((task,))

    async def _run(self, interval_s: float, next_at: float) -> None:
        clock = self._clock
        while True:
            delay = next_at - clock.monotonic()
            if delay > 0:
                await clock.sleep(delay)
            else:
                await asyncio.sleep(0)  # a tick already due: run it, but let others in first
            try:
                await self.run_health_checks()
            except Exception:
                logger.exception("health check run failed")
            except asyncio.CancelledError:
                if _cancelled_from_outside():
                    raise
                # A listener or hook cancelled itself: that must not end the watch.
                logger.error("health check run was cancelled from inside; the checks go on")
            next_at += interval_s
            now = clock.monotonic()
            if next_at < now:
                # Overran: drop the ticks that passed meanwhile, keep the phase.
                next_at += math.ceil((now - next_at) / interval_s) * interval_s

    def __repr__(self) -> str:
        return (
            f"RecoveryManager(group={self._group.name!r}, policy={self._policy!r}, "
            f"check_timeout_s={self.check_timeout_s!r}, running={self.running})"
        )


def _cancelled_from_outside() -> bool:
    """Whether the running task has been asked to cancel (not an error raised by user code)."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0
