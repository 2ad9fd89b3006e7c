import asyncio
import logging
import math
import threading
from typing import Any

import pytest

from corral.guard import AgentGroup, Supervisor, UnknownAgentError
from corral.kernel import InvalidArgumentError
from corral.recovery import (
    HealthStatus,
    RecoveryAction,
    RecoveryListener,
    RecoveryManager,
    RecoveryPolicy,
    RecoveryResult,
)
from corral.runtime import FakeClock


class Agent:
    def __init__(self, agent_id: str) -> None:
        self.agent_id = agent_id
        self.healthy = True


class Recorder(RecoveryListener):
    def __init__(self) -> None:
        self.failed: list[HealthStatus] = []
        self.attempts: list[RecoveryResult] = []
        self.escalations: list[tuple[str, int]] = []

    def on_health_check_failed(self, status: HealthStatus) -> None:
        self.failed.append(status)

    def on_recovery_attempt(self, result: RecoveryResult) -> None:
        self.attempts.append(result)

    def on_escalation(self, agent_id: str, failed_attempts: int) -> None:
        self.escalations.append((agent_id, failed_attempts))


class Setup:
    def __init__(self, policy: RecoveryPolicy | None = None, **kwargs: Any) -> None:
        self.agents = {name: Agent(name) for name in ("worker-1", "worker-2")}
        self.group = AgentGroup("crew", self.agents)
        self.supervisor = Supervisor(self.group)
        self.clock = FakeClock()
        self.manager = RecoveryManager(
            self.supervisor, policy or RecoveryPolicy(), clock=self.clock, **kwargs
        )
        self.recorder = Recorder()
        self.manager.add_listener(self.recorder)

    async def attempts(self, agent_id: str, count: int) -> list[RecoveryResult]:
        """``count`` triggers, each after the cooldown has passed."""
        results = []
        for _ in range(count):
            results.append(await self.manager.trigger_recovery(agent_id, "test trigger"))
            self.clock.advance(self.manager.policy.cooldown_s)
        return results


# --- attempts and the action they take -----------------------------------------------------


async def test_a_trigger_takes_the_default_action_and_counts() -> None:
    s = Setup()
    result = await s.manager.trigger_recovery("worker-1", "stuck on a tool call")
    assert result.agent_id == "worker-1"
    assert result.action_taken is RecoveryAction.RESTART
    assert result.success is True
    assert result.reason == "stuck on a tool call"
    assert result.detail == "restart requested; no restart hook, nothing changed"
    assert result.attempt == 1
    assert result.attempted_at == s.clock.now()
    assert s.manager.retry_count("worker-1") == 1
    assert s.manager.retry_count("worker-2") == 0
    assert s.manager.history == [result]
    assert s.recorder.attempts == [result]
    assert "worker-1" in s.group


async def test_within_the_cooldown_nothing_happens_and_a_failed_result_returns() -> None:
    s = Setup(RecoveryPolicy(cooldown_s=10))
    first = await s.manager.trigger_recovery("worker-1", "first")
    s.clock.advance(9.5)
    skipped = await s.manager.trigger_recovery("worker-1", "second")
    assert skipped.action_taken is None
    assert skipped.success is False
    assert skipped.reason == "second"
    assert skipped.detail == (
        "in cooldown: 9.5 s since the previous attempt, cooldown is 10 s; nothing done"
    )
    assert skipped.attempt == 1
    assert s.manager.retry_count("worker-1") == 1
    assert s.manager.history == [first]
    assert s.recorder.attempts == [first]
    # Cooldowns are per agent.
    other = await s.manager.trigger_recovery("worker-2", "other")
    assert other.action_taken is RecoveryAction.RESTART


async def test_the_cooldown_ends_exactly_after_cooldown_s() -> None:
    s = Setup(RecoveryPolicy(cooldown_s=10))
    await s.manager.trigger_recovery("worker-1", "first")
    s.clock.advance(9.999)
    assert (await s.manager.trigger_recovery("worker-1", "x")).action_taken is None
    s.clock.advance(0.001)
    assert (
        await s.manager.trigger_recovery("worker-1", "x")
    ).action_taken is RecoveryAction.RESTART
    assert s.manager.retry_count("worker-1") == 2


async def test_a_skipped_attempt_does_not_restart_the_cooldown() -> None:
    s = Setup(RecoveryPolicy(cooldown_s=10))
    await s.manager.trigger_recovery("worker-1", "first")
    s.clock.advance(6)
    await s.manager.trigger_recovery("worker-1", "skipped")
    s.clock.advance(4)
    assert (
        await s.manager.trigger_recovery("worker-1", "x")
    ).action_taken is RecoveryAction.RESTART


async def test_a_zero_cooldown_never_skips() -> None:
    s = Setup(RecoveryPolicy(cooldown_s=0, max_retries=10))
    results = [await s.manager.trigger_recovery("worker-1", "x") for _ in range(5)]
    assert [r.attempt for r in results] == [1, 2, 3, 4, 5]


async def test_with_the_defaults_three_restarts_then_eject_and_no_escalation() -> None:
    s = Setup()
    results = await s.attempts("worker-1", 4)
    assert [r.action_taken for r in results] == [RecoveryAction.RESTART] * 3 + [
        RecoveryAction.EJECT
    ]
    assert s.recorder.escalations == []
    assert "worker-1" not in s.group
    assert results[3].detail == "removed from group 'crew' after 3 attempts (max_retries 3)"
    assert results[3].attempt == 4


async def test_escalate_after_below_max_retries_escalates_then_ejects() -> None:
    s = Setup(RecoveryPolicy(max_retries=3, escalate_after=2, cooldown_s=10))
    s.manager.add_health_check("worker-1", lambda agent: True)
    results = await s.attempts("worker-1", 4)
    assert [r.action_taken for r in results] == [
        RecoveryAction.RESTART,
        RecoveryAction.RESTART,
        RecoveryAction.ESCALATE,
        RecoveryAction.EJECT,
    ]
    assert s.recorder.escalations == [("worker-1", 2)]
    escalation = results[2]
    assert escalation.success is True
    assert escalation.detail == "escalated after 2 attempts (escalate_after 2)"
    # EJECT removes the agent with its check and its count.
    assert "worker-1" not in s.group
    assert "worker-1" not in s.manager.health_checks
    assert s.manager.retry_count("worker-1") == 0
    assert "worker-2" in s.group


async def test_escalate_changes_nothing_in_the_group() -> None:
    s = Setup(RecoveryPolicy(escalate_after=1, max_retries=5, cooldown_s=0))
    await s.manager.trigger_recovery("worker-1", "x")
    result = await s.manager.trigger_recovery("worker-1", "x")
    assert result.action_taken is RecoveryAction.ESCALATE
    assert s.group.get("worker-1") is s.agents["worker-1"]
    assert s.recorder.escalations == [("worker-1", 1)]


async def test_escalation_is_told_before_the_attempt() -> None:
    order: list[str] = []

    class Ordered:
        def on_escalation(self, agent_id: str, failed_attempts: int) -> None:
            order.append("escalation")

        def on_recovery_attempt(self, result: RecoveryResult) -> None:
            order.append(f"attempt:{result.action_taken}")

    s = Setup(RecoveryPolicy(escalate_after=1, max_retries=5, cooldown_s=0))
    s.manager.add_listener(Ordered())
    await s.manager.trigger_recovery("worker-1", "x")
    await s.manager.trigger_recovery("worker-1", "x")
    assert order == ["attempt:restart", "escalation", "attempt:escalate"]


async def test_replace_removes_the_agent_and_a_replacement_starts_clean() -> None:
    s = Setup(RecoveryPolicy(default_action=RecoveryAction.REPLACE))
    s.manager.add_health_check("worker-1", lambda agent: True)
    result = await s.manager.trigger_recovery("worker-1", "wedged")
    assert result.action_taken is RecoveryAction.REPLACE
    assert result.success
    assert result.detail == "removed from group 'crew'; adding a replacement is the caller's to do"
    assert "worker-1" not in s.group
    assert "worker-1" not in s.manager.health_checks
    assert s.manager.retry_count("worker-1") == 0
    s.group.add("worker-1", Agent("worker-1"))
    again = await s.manager.trigger_recovery("worker-1", "new one wedged too")
    # No cooldown or count carried over from the agent that was replaced.
    assert again.action_taken is RecoveryAction.REPLACE
    assert again.attempt == 1


async def test_restart_calls_the_hook_with_the_agent_and_action() -> None:
    calls: list[tuple[str, object, RecoveryAction]] = []

    def hook(agent_id: str, agent: object, action: RecoveryAction) -> None:
        calls.append((agent_id, agent, action))

    s = Setup(RecoveryPolicy(cooldown_s=0), restart_hook=hook)
    result = await s.manager.trigger_recovery("worker-1", "x")
    assert calls == [("worker-1", s.agents["worker-1"], RecoveryAction.RESTART)]
    assert result.success
    assert result.detail == "restart done by the restart hook"


async def test_restart_clean_calls_an_async_hook() -> None:
    calls: list[RecoveryAction] = []

    async def hook(agent_id: str, agent: object, action: RecoveryAction) -> None:
        await asyncio.sleep(0)
        calls.append(action)

    s = Setup(RecoveryPolicy(default_action=RecoveryAction.RESTART_CLEAN), restart_hook=hook)
    result = await s.manager.trigger_recovery("worker-2", "x")
    assert calls == [RecoveryAction.RESTART_CLEAN]
    assert result.action_taken is RecoveryAction.RESTART_CLEAN
    assert result.detail == "restart_clean done by the restart hook"


async def test_a_failing_hook_is_a_failed_attempt_that_still_counts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def hook(agent_id: str, agent: object, action: RecoveryAction) -> None:
        raise OSError("no such process")

    s = Setup(restart_hook=hook)
    with caplog.at_level(logging.ERROR, logger="corral.recovery"):
        result = await s.manager.trigger_recovery("worker-1", "x")
    assert result.success is False
    assert result.action_taken is RecoveryAction.RESTART
    assert result.detail == "restart hook failed: OSError: no such process"
    assert s.manager.retry_count("worker-1") == 1
    assert s.manager.history == [result]
    assert s.recorder.attempts == [result]
    assert "restart hook failed" in caplog.text


async def test_the_hook_is_not_called_for_other_actions() -> None:
    calls: list[RecoveryAction] = []
    s = Setup(
        RecoveryPolicy(max_retries=2, escalate_after=1, cooldown_s=0),
        restart_hook=lambda agent_id, agent, action: calls.append(action),
    )
    actions = [(await s.manager.trigger_recovery("worker-1", "x")).action_taken for _ in range(3)]
    assert actions == [RecoveryAction.RESTART, RecoveryAction.ESCALATE, RecoveryAction.EJECT]
    assert calls == [RecoveryAction.RESTART]


# --- counts, history, unknown agents -------------------------------------------------------


async def test_reset_retry_counter_starts_the_count_again() -> None:
    s = Setup(RecoveryPolicy(cooldown_s=0))
    await s.attempts("worker-1", 3)
    assert s.manager.retry_count("worker-1") == 3
    s.manager.reset_retry_counter("worker-1")
    assert s.manager.retry_count("worker-1") == 0
    result = await s.manager.trigger_recovery("worker-1", "x")
    assert (result.action_taken, result.attempt) == (RecoveryAction.RESTART, 1)
    s.manager.reset_retry_counter("never-seen")  # idempotent, no error
    assert s.manager.retry_count("never-seen") == 0


async def test_history_is_a_copy_in_order() -> None:
    s = Setup(RecoveryPolicy(cooldown_s=0))
    a = await s.manager.trigger_recovery("worker-1", "a")
    b = await s.manager.trigger_recovery("worker-2", "b")
    history = s.manager.history
    assert history == [a, b]
    history.clear()
    assert s.manager.history == [a, b]


async def test_the_history_keeps_the_newest_max_history_results_in_order() -> None:
    s = Setup(RecoveryPolicy(cooldown_s=0, max_retries=100, escalate_after=100), max_history=3)
    assert s.manager.max_history == 3
    results = [
        await s.manager.trigger_recovery(f"worker-{1 + n % 2}", f"reason {n}") for n in range(5)
    ]
    assert s.manager.history == results[2:]
    assert [r.reason for r in s.manager.history] == ["reason 2", "reason 3", "reason 4"]
    assert isinstance(s.manager.history, list)
    # Dropping history drops no counts, and listeners still heard of every attempt.
    assert (s.manager.retry_count("worker-1"), s.manager.retry_count("worker-2")) == (3, 2)
    assert s.recorder.attempts == results
    newest = await s.manager.trigger_recovery("worker-2", "reason 5")
    assert s.manager.history == [*results[3:], newest]


async def test_a_history_of_one_keeps_only_the_latest() -> None:
    s = Setup(RecoveryPolicy(cooldown_s=0, max_retries=100), max_history=1)
    await s.manager.trigger_recovery("worker-1", "old")
    latest = await s.manager.trigger_recovery("worker-1", "new")
    assert s.manager.history == [latest]


def test_the_history_holds_a_thousand_by_default() -> None:
    assert Setup().manager.max_history == 1000


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "10", None])
def test_max_history_must_be_a_positive_integer(value: object) -> None:
    with pytest.raises(InvalidArgumentError, match="max_history must be a positive integer") as e:
        Setup(max_history=value)
    assert e.value.code == "invalid_argument"
    assert e.value.where == "RecoveryManager"


async def test_triggering_an_unknown_agent_raises_a_typed_error() -> None:
    s = Setup()
    with pytest.raises(UnknownAgentError) as caught:
        await s.manager.trigger_recovery("ghost", "x")
    assert caught.value.code == "unknown_agent"
    assert caught.value.message == "agent 'ghost' is not a member of group 'crew' (2 members)"
    assert s.manager.history == []
    assert s.recorder.attempts == []


async def test_triggering_an_ejected_agent_raises() -> None:
    s = Setup(RecoveryPolicy(default_action=RecoveryAction.EJECT))
    await s.manager.trigger_recovery("worker-1", "x")
    with pytest.raises(UnknownAgentError):
        await s.manager.trigger_recovery("worker-1", "again")


def test_adding_a_check_for_an_unknown_agent_raises() -> None:
    s = Setup()
    with pytest.raises(UnknownAgentError, match="'ghost'"):
        s.manager.add_health_check("ghost", lambda agent: True)
    assert s.manager.health_checks == {}


def test_checks_are_replaced_and_removed_by_agent_id() -> None:
    s = Setup()

    def first(agent: object) -> bool:
        return True

    def second(agent: object) -> bool:
        return False

    s.manager.add_health_check("worker-1", first)
    s.manager.add_health_check("worker-1", second)
    assert s.manager.health_checks == {"worker-1": second}
    assert s.manager.remove_health_check("worker-1") is True
    assert s.manager.remove_health_check("worker-1") is False


# --- health checks -------------------------------------------------------------------------


async def test_a_healthy_agent_is_reported_and_left_alone() -> None:
    s = Setup()
    seen: list[object] = []

    def check(agent: object) -> bool:
        seen.append(agent)
        return True

    s.manager.add_health_check("worker-1", check)
    statuses = await s.manager.run_health_checks()
    assert seen == [s.agents["worker-1"]]
    assert statuses == {
        "worker-1": HealthStatus(
            agent_id="worker-1", healthy=True, reason=None, checked_at=s.clock.now()
        )
    }
    assert s.manager.history == []
    assert s.recorder.failed == []


async def test_a_failed_check_tells_listeners_and_starts_an_attempt() -> None:
    s = Setup()
    s.manager.add_health_check("worker-1", lambda agent: False)
    statuses = await s.manager.run_health_checks()
    status = statuses["worker-1"]
    assert status.healthy is False
    assert status.reason == "health check returned False"
    assert len(s.recorder.failed) == 1
    told = s.recorder.failed[0]
    assert (told.agent_id, told.healthy, told.reason) == ("worker-1", False, status.reason)
    assert status.recovery is not None
    assert status.recovery.action_taken is RecoveryAction.RESTART
    assert status.recovery.reason == "health check returned False"
    assert s.manager.history == [status.recovery]


async def test_a_raising_check_is_a_failure(caplog: pytest.LogCaptureFixture) -> None:
    s = Setup()

    def check(agent: object) -> bool:
        raise TimeoutError("ping took too long")

    s.manager.add_health_check("worker-1", check)
    with caplog.at_level(logging.WARNING, logger="corral.recovery"):
        statuses = await s.manager.run_health_checks()
    assert statuses["worker-1"].reason == "health check raised TimeoutError: ping took too long"
    assert s.manager.retry_count("worker-1") == 1
    assert "worker-1" in caplog.text


async def test_a_check_cancelled_from_inside_is_a_failure_not_a_cancellation() -> None:
    s = Setup()

    async def check(agent: object) -> bool:
        raise asyncio.CancelledError  # e.g. a ping whose own task was cancelled

    s.manager.add_health_check("worker-1", check)
    s.manager.add_health_check("worker-2", lambda agent: True)
    statuses = await s.manager.run_health_checks()
    assert statuses["worker-1"].healthy is False
    assert statuses["worker-1"].reason == "health check was cancelled"
    assert statuses["worker-2"].healthy is True
    assert s.manager.retry_count("worker-1") == 1


async def test_cancelling_a_run_of_checks_from_outside_propagates() -> None:
    s = Setup()
    entered = asyncio.Event()

    async def hangs(agent: object) -> bool:
        entered.set()
        await asyncio.Event().wait()
        return True

    s.manager.add_health_check("worker-1", hangs)
    run = asyncio.create_task(s.manager.run_health_checks())
    await entered.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert s.manager.history == []
    assert s.recorder.failed == []


@pytest.mark.parametrize("answer", [None, 1, "ok", [True]])
async def test_a_check_answering_anything_but_a_bool_is_a_failure(answer: object) -> None:
    s = Setup()
    s.manager.add_health_check("worker-1", lambda agent: answer)  # type: ignore[arg-type,return-value]
    statuses = await s.manager.run_health_checks()
    assert statuses["worker-1"].healthy is False
    assert statuses["worker-1"].reason == f"health check returned {answer!r}, not a bool"


async def test_async_checks_are_awaited() -> None:
    s = Setup()

    async def check(agent: object) -> bool:
        await asyncio.sleep(0)
        assert isinstance(agent, Agent)
        return agent.healthy

    s.agents["worker-2"].healthy = False
    s.manager.add_health_check("worker-1", check)
    s.manager.add_health_check("worker-2", check)
    statuses = await s.manager.run_health_checks()
    assert statuses["worker-1"].healthy is True
    assert statuses["worker-2"].healthy is False
    assert [r.agent_id for r in s.manager.history] == ["worker-2"]


async def test_agents_no_longer_in_the_group_are_skipped() -> None:
    s = Setup()
    calls: list[object] = []

    def check(agent: object) -> bool:
        calls.append(agent)
        return True

    s.manager.add_health_check("worker-1", check)
    s.manager.add_health_check("worker-2", check)
    s.group.remove("worker-2")
    statuses = await s.manager.run_health_checks()
    assert list(statuses) == ["worker-1"]
    assert calls == [s.agents["worker-1"]]
    assert "worker-2" in s.manager.health_checks  # kept, in case it comes back


async def test_an_agent_removed_while_its_check_runs_is_not_recovered() -> None:
    s = Setup()

    async def check(agent: object) -> bool:
        s.group.remove("worker-1")
        await asyncio.sleep(0)
        return False

    s.manager.add_health_check("worker-1", check)
    statuses = await s.manager.run_health_checks()
    assert statuses["worker-1"].healthy is False
    assert statuses["worker-1"].recovery is None
    assert s.manager.history == []


async def test_the_count_is_not_reset_when_an_agent_is_healthy_again() -> None:
    s = Setup(RecoveryPolicy(cooldown_s=0))
    agent = s.agents["worker-1"]
    s.manager.add_health_check("worker-1", lambda a: agent.healthy)
    agent.healthy = False
    await s.manager.run_health_checks()
    await s.manager.run_health_checks()
    agent.healthy = True
    await s.manager.run_health_checks()
    assert s.manager.retry_count("worker-1") == 2


async def test_checks_run_concurrently() -> None:
    s = Setup()
    arrived: list[str] = []
    both = asyncio.Event()

    async def check(agent: object) -> bool:
        assert isinstance(agent, Agent)
        arrived.append(agent.agent_id)
        if len(arrived) == 2:
            both.set()
        # Each check waits for the other: run one after the other, they would never finish.
        await both.wait()
        return True

    s.manager.add_health_check("worker-1", check)
    s.manager.add_health_check("worker-2", check)
    statuses = await asyncio.wait_for(s.manager.run_health_checks(), timeout=5)
    assert set(statuses) == {"worker-1", "worker-2"}


async def test_a_failing_check_inside_the_cooldown_reports_the_skip() -> None:
    s = Setup(RecoveryPolicy(cooldown_s=30))
    s.manager.add_health_check("worker-1", lambda agent: False)
    await s.manager.run_health_checks()
    statuses = await s.manager.run_health_checks()
    recovery = statuses["worker-1"].recovery
    assert recovery is not None
    assert recovery.action_taken is None
    assert len(s.recorder.failed) == 2
    assert len(s.recorder.attempts) == 1


# --- listeners -----------------------------------------------------------------------------


async def test_listeners_may_be_partial_and_async() -> None:
    told: list[str] = []

    class OnlyAttempts:
        async def on_recovery_attempt(self, result: RecoveryResult) -> None:
            await asyncio.sleep(0)
            told.append(result.agent_id)

    s = Setup()
    s.manager.add_listener(OnlyAttempts())
    s.manager.add_health_check("worker-1", lambda agent: False)
    await s.manager.run_health_checks()
    assert told == ["worker-1"]


async def test_a_raising_listener_is_logged_and_stops_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken:
        def on_health_check_failed(self, status: HealthStatus) -> None:
            raise RuntimeError("listener bug")

        async def on_recovery_attempt(self, result: RecoveryResult) -> None:
            raise RuntimeError("async listener bug")

        def on_escalation(self, agent_id: str, failed_attempts: int) -> None:
            raise RuntimeError("escalation bug")

    s = Setup(RecoveryPolicy(escalate_after=1, max_retries=3, cooldown_s=0))
    s.manager.remove_listener(s.recorder)
    s.manager.add_listener(Broken())
    s.manager.add_listener(s.recorder)
    s.manager.add_health_check("worker-1", lambda agent: False)
    with caplog.at_level(logging.ERROR, logger="corral.recovery"):
        await s.manager.run_health_checks()
        await s.manager.run_health_checks()
    assert len(s.recorder.failed) == 2
    assert [r.action_taken for r in s.recorder.attempts] == [
        RecoveryAction.RESTART,
        RecoveryAction.ESCALATE,
    ]
    assert s.recorder.escalations == [("worker-1", 1)]
    assert "listener bug" in caplog.text
    assert "async listener bug" in caplog.text
    assert "escalation bug" in caplog.text


async def test_remove_listener() -> None:
    s = Setup()
    assert s.manager.remove_listener(s.recorder) is True
    assert s.manager.remove_listener(s.recorder) is False
    await s.manager.trigger_recovery("worker-1", "x")
    assert s.recorder.attempts == []


def test_a_listener_needs_at_least_one_method() -> None:
    s = Setup()
    with pytest.raises(InvalidArgumentError, match="listener must be an object with"):
        s.manager.add_listener(object())

    class NotCallable:
        on_escalation = "nope"

    with pytest.raises(InvalidArgumentError):
        s.manager.add_listener(NotCallable())


# --- bad input -----------------------------------------------------------------------------


def test_constructor_refuses_bad_arguments() -> None:
    s = Setup()
    with pytest.raises(InvalidArgumentError, match="supervisor must be a Supervisor"):
        RecoveryManager(s.group, RecoveryPolicy())  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="policy must be a RecoveryPolicy"):
        RecoveryManager(s.supervisor, {"max_retries": 3})  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="restart_hook must be callable"):
        RecoveryManager(s.supervisor, RecoveryPolicy(), restart_hook="restart")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="clock must be a Clock"):
        RecoveryManager(s.supervisor, RecoveryPolicy(), clock=object())  # type: ignore[arg-type]


def test_the_policy_defaults_and_the_supervisor_is_kept() -> None:
    s = Setup()
    manager = RecoveryManager(s.supervisor)
    assert manager.policy == RecoveryPolicy()
    assert manager.supervisor is s.supervisor
    assert "crew" in repr(manager)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("", "x"), "agent_id must be a non-empty string"),
        ((None, "x"), "agent_id must be a non-empty string"),
        (("worker-1", ""), "reason must be a non-empty string"),
        (("worker-1", None), "reason must be a non-empty string"),
    ],
)
async def test_trigger_recovery_refuses_bad_arguments(args: tuple[Any, ...], message: str) -> None:
    s = Setup()
    with pytest.raises(InvalidArgumentError, match=message):
        await s.manager.trigger_recovery(*args)
    assert s.manager.retry_count("worker-1") == 0


@pytest.mark.parametrize("agent_id", ["", None, ["worker-1"]])
def test_lookups_by_agent_id_refuse_bad_ids(agent_id: Any) -> None:
    s = Setup()
    for method in (
        s.manager.retry_count,
        s.manager.reset_retry_counter,
        s.manager.remove_health_check,
    ):
        with pytest.raises(InvalidArgumentError, match="agent_id must be a non-empty string"):
            method(agent_id)


def test_add_health_check_refuses_bad_arguments() -> None:
    s = Setup()
    with pytest.raises(InvalidArgumentError, match="agent_id must be a non-empty string"):
        s.manager.add_health_check("", lambda agent: True)
    with pytest.raises(InvalidArgumentError, match="check must be callable, got True"):
        s.manager.add_health_check("worker-1", True)  # type: ignore[arg-type]


# --- concurrency ---------------------------------------------------------------------------


async def test_racing_triggers_make_exactly_one_attempt_inside_the_cooldown() -> None:
    s = Setup(RecoveryPolicy(cooldown_s=60))

    async def trigger(n: int) -> RecoveryResult:
        await asyncio.sleep(0)
        return await s.manager.trigger_recovery("worker-1", f"trigger {n}")

    results = await asyncio.gather(*(trigger(n) for n in range(50)))
    taken = [r for r in results if r.action_taken is not None]
    assert len(taken) == 1
    assert s.manager.retry_count("worker-1") == 1
    assert len(s.manager.history) == 1


def test_attempts_from_many_threads_never_lose_a_count() -> None:
    s = Setup(RecoveryPolicy(cooldown_s=0, max_retries=10_000, escalate_after=10_000))
    start = threading.Barrier(8)

    def worker() -> None:
        async def many() -> None:
            for _ in range(50):
                await s.manager.trigger_recovery("worker-1", "load")

        start.wait()
        asyncio.run(many())

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert s.manager.retry_count("worker-1") == 400
    assert sorted(r.attempt for r in s.manager.history) == list(range(1, 401))


async def test_racing_attempts_eject_only_once() -> None:
    s = Setup(RecoveryPolicy(cooldown_s=0, max_retries=1, default_action=RecoveryAction.RESTART))
    await s.manager.trigger_recovery("worker-1", "first")
    outcomes = await asyncio.gather(
        *(s.manager.trigger_recovery("worker-1", "race") for _ in range(10)),
        return_exceptions=True,
    )
    ejected = [o for o in outcomes if isinstance(o, RecoveryResult)]
    refused = [o for o in outcomes if isinstance(o, UnknownAgentError)]
    assert [r.action_taken for r in ejected] == [RecoveryAction.EJECT]
    assert len(refused) == 9


@pytest.mark.parametrize("interval", [0, -1, math.nan, "10"])
async def test_start_refuses_bad_intervals(interval: object) -> None:
    s = Setup()
    with pytest.raises(InvalidArgumentError, match="interval_s must be a finite number > 0"):
        s.manager.start(interval)  # type: ignore[arg-type]
    assert not s.manager.running
