import asyncio
import logging
import math
import threading
from collections.abc import Mapping

import pytest

from corral.guard import (
    AgentGroup,
    ApprovalRequest,
    GuardrailResult,
    HumanApproval,
    OnRequest,
    Severity,
    Supervisor,
)
from corral.kernel import InvalidArgumentError
from corral.runtime import FakeClock


class Inbox:
    """An on_request callback that keeps the requests for the test to answer."""

    def __init__(self) -> None:
        self.requests: list[ApprovalRequest] = []
        self.arrived = asyncio.Event()

    def __call__(self, request: ApprovalRequest) -> None:
        self.requests.append(request)
        self.arrived.set()

    async def next(self, count: int = 1) -> list[ApprovalRequest]:
        while len(self.requests) < count:
            self.arrived.clear()
            await self.arrived.wait()
        return self.requests


def answering(value: object) -> OnRequest:
    def on_request(request: ApprovalRequest) -> None:
        request.approval.set_result(value)  # type: ignore[arg-type]

    return on_request


async def test_non_matching_actions_are_allowed_without_asking() -> None:
    inbox = Inbox()
    gate = HumanApproval({"deploy", "delete"}, inbox)
    result = await gate.check("w", "read-file", {})
    assert result is GuardrailResult.allow()
    assert inbox.requests == []


@pytest.mark.parametrize(
    ("patterns", "action"),
    [
        ({"deploy"}, "redeploy-cache"),
        ({"deploy"}, "Redeploy-Cache"),
        ({"DELETE"}, "delete user 7"),
        ({"Drop Table"}, "sql: DROP TABLE users"),
        ({"straße"}, "STRASSE cleanup"),  # case folding, not just lower()
    ],
)
async def test_matching_is_a_substring_ignoring_case(patterns: set[str], action: str) -> None:
    gate = HumanApproval(patterns, answering(False))
    assert gate.matches(action)
    result = await gate.check("w", action, {})
    assert result.allowed is False


async def test_the_callback_gets_the_request_and_true_allows() -> None:
    inbox = Inbox()
    gate = HumanApproval({"deploy"}, inbox)
    context = {"target": "production"}
    task = asyncio.create_task(gate.check("release-agent", "deploy", context))
    (request,) = await inbox.next()
    assert (request.agent_id, request.action, request.context) == (
        "release-agent",
        "deploy",
        context,
    )
    assert not task.done()
    assert not request.answered
    request.approval.set_result(True)
    result = await task
    assert result.allowed
    assert result.severity is Severity.INFO


async def test_false_blocks_with_a_reason_naming_the_action() -> None:
    result = await HumanApproval({"deploy"}, answering(False)).check("w", "deploy now", {})
    assert result.allowed is False
    assert result.severity is Severity.BLOCK
    assert result.reason == "Approval for action 'deploy now' was denied"


@pytest.mark.parametrize("answer", [1, 0, "yes", None])
async def test_an_answer_other_than_a_bool_blocks(answer: object) -> None:
    result = await HumanApproval({"deploy"}, answering(answer)).check("w", "deploy", {})
    assert result.allowed is False
    assert result.reason == f"Approval for action 'deploy' answered {answer!r}, not True or False"


async def test_an_async_callback_is_awaited() -> None:
    async def on_request(request: ApprovalRequest) -> None:
        await asyncio.sleep(0)
        request.approve()

    assert (await HumanApproval({"deploy"}, on_request).check("w", "deploy", {})).allowed


async def test_a_raising_callback_blocks(caplog: pytest.LogCaptureFixture) -> None:
    def on_request(request: ApprovalRequest) -> None:
        raise ConnectionError("pager down")

    with caplog.at_level(logging.ERROR, logger="corral.guard.approval"):
        result = await HumanApproval({"deploy"}, on_request).check("w", "deploy", {})
    assert result.allowed is False
    assert result.reason == "Approval request for action 'deploy' failed: pager down"
    assert caplog.records


async def test_a_raising_async_callback_blocks() -> None:
    async def on_request(request: ApprovalRequest) -> None:
        await asyncio.sleep(0)
        raise ConnectionError("pager down")

    result = await HumanApproval({"deploy"}, on_request).check("w", "deploy", {})
    assert result.reason == "Approval request for action 'deploy' failed: pager down"


async def test_an_async_callback_that_ends_cancelled_blocks() -> None:
    async def on_request(request: ApprovalRequest) -> None:
        raise asyncio.CancelledError

    result = await HumanApproval({"deploy"}, on_request).check("w", "deploy", {})
    assert result.allowed is False
    assert result.reason == "Approval request for action 'deploy' was cancelled"


async def test_cancelling_the_waiter_during_an_async_callback_withdraws_everything() -> None:
    entered = asyncio.Event()
    callback_cancelled = asyncio.Event()
    requests: list[ApprovalRequest] = []

    async def on_request(request: ApprovalRequest) -> None:
        requests.append(request)
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            callback_cancelled.set()
            raise

    gate = HumanApproval({"deploy"}, on_request)
    task = asyncio.create_task(gate.check("w", "deploy", {}))
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(callback_cancelled.wait(), timeout=5)
    assert requests[0].approval.cancelled()
    assert gate.pending == []


async def test_an_exceptionally_completed_future_blocks() -> None:
    def on_request(request: ApprovalRequest) -> None:
        request.approval.set_exception(RuntimeError("reviewer crashed"))

    result = await HumanApproval({"deploy"}, on_request).check("w", "deploy", {})
    assert result.allowed is False
    assert result.reason == "Approval for action 'deploy' failed: reviewer crashed"


async def test_a_cancelled_future_blocks() -> None:
    inbox = Inbox()
    task = asyncio.create_task(HumanApproval({"deploy"}, inbox).check("w", "deploy", {}))
    (request,) = await inbox.next()
    request.approval.cancel()
    result = await task
    assert result.reason == "Approval for action 'deploy' was cancelled"


async def test_waiting_blocks_neither_the_loop_nor_a_thread() -> None:
    inbox = Inbox()
    gate = HumanApproval({"deploy"}, inbox)
    threads_before = threading.active_count()
    task = asyncio.create_task(gate.check("w", "deploy", {}))
    (request,) = await inbox.next()
    # The loop keeps running other work while the approval waits.
    ticks = 0
    for _ in range(50):
        await asyncio.sleep(0)
        ticks += 1
    assert ticks == 50
    assert not task.done()
    assert threading.active_count() <= threads_before  # no thread was started to wait
    assert gate.pending == [request]
    request.approve()
    assert (await task).allowed
    assert gate.pending == []


async def test_an_answer_from_another_thread_is_delivered_safely() -> None:
    inbox = Inbox()
    task = asyncio.create_task(HumanApproval({"deploy"}, inbox).check("w", "deploy", {}))
    (request,) = await inbox.next()
    answerer = threading.Thread(target=request.deny)
    answerer.start()
    result = await task
    answerer.join()
    assert result.reason == "Approval for action 'deploy' was denied"


async def test_only_the_first_answer_counts() -> None:
    def on_request(request: ApprovalRequest) -> None:
        request.approve()
        request.deny()
        request.resolve(False)

    assert (await HumanApproval({"deploy"}, on_request).check("w", "deploy", {})).allowed


def test_a_late_answer_after_the_loop_has_ended_is_ignored() -> None:
    asked: list[ApprovalRequest] = []

    async def ask() -> GuardrailResult:
        clock = FakeClock()
        inbox = Inbox()
        gate = HumanApproval({"deploy"}, inbox, timeout_s=1, clock=clock)
        task = asyncio.create_task(gate.check("w", "deploy", {}))
        asked.extend(await inbox.next())
        clock.advance(1)
        return await task

    result = asyncio.run(ask())
    assert result.reason == "Approval for action 'deploy' timed out after 1 s without an answer"
    # The loop is closed now; the person answering late gets no error.
    asked[0].approve()
    asked[0].deny()
    assert asked[0].approval.cancelled()


def test_an_answer_to_a_request_whose_loop_closed_while_pending_is_ignored() -> None:
    loop = asyncio.new_event_loop()
    future: asyncio.Future[bool] = loop.create_future()
    request = ApprovalRequest("w", "deploy", {}, future)
    loop.close()
    request.approve()  # from a thread with no loop: nothing waits, nothing raises
    assert not future.done()


async def test_resolve_needs_a_bool() -> None:
    inbox = Inbox()
    task = asyncio.create_task(HumanApproval({"deploy"}, inbox).check("w", "deploy", {}))
    (request,) = await inbox.next()
    with pytest.raises(InvalidArgumentError, match="allowed must be a bool, got 'yes'"):
        request.resolve("yes")  # type: ignore[arg-type]
    request.approve()
    assert (await task).allowed


# --- timeout -------------------------------------------------------------------------------


async def test_no_answer_within_the_timeout_blocks_saying_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    inbox = Inbox()
    gate = HumanApproval({"deploy"}, inbox, timeout_s=5, clock=clock)
    task = asyncio.create_task(gate.check("w", "deploy", {}))
    (request,) = await inbox.next()
    clock.advance(4.9)
    for _ in range(5):
        await asyncio.sleep(0)
    assert not task.done()
    with caplog.at_level(logging.WARNING, logger="corral.guard.approval"):
        clock.advance(0.1)
        result = await task
    assert result.allowed is False
    assert result.reason == "Approval for action 'deploy' timed out after 5 s without an answer"
    assert "timed out after 5 s" in caplog.text
    # The request is withdrawn: a late answer changes nothing and raises nothing.
    assert request.approval.cancelled()
    request.approve()
    assert gate.pending == []


async def test_a_fractional_timeout_is_named_in_the_reason() -> None:
    clock = FakeClock()
    inbox = Inbox()
    task = asyncio.create_task(
        HumanApproval({"x"}, inbox, timeout_s=0.25, clock=clock).check("w", "x", {})
    )
    await inbox.next()
    clock.advance(0.25)
    assert (await task).reason == "Approval for action 'x' timed out after 0.25 s without an answer"


async def test_an_answer_in_time_wins_and_the_timer_is_cleared() -> None:
    clock = FakeClock()
    inbox = Inbox()
    task = asyncio.create_task(
        HumanApproval({"deploy"}, inbox, timeout_s=5, clock=clock).check("w", "deploy", {})
    )
    (request,) = await inbox.next()
    clock.advance(4)
    request.approve()
    assert (await task).allowed
    assert clock.pending_timers == 0


async def test_the_timeout_covers_a_hanging_async_callback() -> None:
    clock = FakeClock()
    entered = asyncio.Event()
    cancelled = asyncio.Event()

    async def on_request(request: ApprovalRequest) -> None:
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    task = asyncio.create_task(
        HumanApproval({"deploy"}, on_request, timeout_s=30, clock=clock).check("w", "deploy", {})
    )
    await entered.wait()
    clock.advance(30)
    result = await task
    assert result.reason == "Approval for action 'deploy' timed out after 30 s without an answer"
    await asyncio.wait_for(cancelled.wait(), timeout=5)


async def test_without_a_timeout_it_waits_as_long_as_it_takes() -> None:
    clock = FakeClock()
    inbox = Inbox()
    task = asyncio.create_task(HumanApproval({"x"}, inbox, clock=clock).check("w", "x", {}))
    (request,) = await inbox.next()
    clock.advance(10**6)
    await asyncio.sleep(0)
    assert not task.done()
    request.approve()
    assert (await task).allowed


async def test_cancelling_the_waiting_task_propagates_and_withdraws_the_request() -> None:
    inbox = Inbox()
    gate = HumanApproval({"deploy"}, inbox)
    task = asyncio.create_task(gate.check("w", "deploy", {}))
    (request,) = await inbox.next()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert request.approval.cancelled()
    assert gate.pending == []


# --- several agents at once ----------------------------------------------------------------


async def test_approvals_for_many_agents_at_once_each_get_their_answer() -> None:
    inbox = Inbox()
    supervisor = Supervisor(AgentGroup("crew"), [HumanApproval({"deploy"}, inbox)])
    tasks = [
        asyncio.create_task(supervisor.check_action(f"agent-{n}", f"deploy-{n}")) for n in range(40)
    ]
    requests = await inbox.next(40)
    assert sorted(r.agent_id for r in requests) == sorted(f"agent-{n}" for n in range(40))
    # Answer in reverse order; even agents approved, odd denied.
    for request in reversed(requests):
        n = int(request.agent_id.split("-")[1])
        assert request.action == f"deploy-{n}"
        request.resolve(n % 2 == 0)
    results = await asyncio.gather(*tasks)
    for n, result in enumerate(results):
        assert result.allowed is (n % 2 == 0)
        if n % 2:
            assert result.reason == f"Approval for action 'deploy-{n}' was denied"


async def test_answers_from_many_threads_at_once() -> None:
    inbox = Inbox()
    gate = HumanApproval({"deploy"}, inbox)
    tasks = [asyncio.create_task(gate.check(f"a{n}", "deploy", {})) for n in range(20)]
    requests = await inbox.next(20)
    threads = [threading.Thread(target=r.resolve, args=(r.agent_id < "a5",)) for r in requests]
    for t in threads:
        t.start()
    results = await asyncio.gather(*tasks)
    for t in threads:
        t.join()
    for n, result in enumerate(results):
        assert result.allowed is (f"a{n}" < "a5")


# --- the seed's example --------------------------------------------------------------------


class CostCap:
    name = "cost-cap"

    def check(self, agent_id: str, action: str, context: Mapping[str, object]) -> GuardrailResult:
        cost = context.get("cost")
        if isinstance(cost, int | float) and cost > 100:
            return GuardrailResult.blocked(f"Cost {cost} is over the cap")
        return GuardrailResult.allow()


async def test_cost_cap_then_approval_as_in_the_seed() -> None:
    asked: list[str] = []

    def on_request(request: ApprovalRequest) -> None:
        asked.append(f"{request.agent_id} wants to {request.action}")
        request.approval.set_result(True)

    approval = HumanApproval({"deploy", "delete"}, on_request)
    assert approval.name == "hitl-approval"
    supervisor = Supervisor(AgentGroup("crew"), [CostCap(), approval])
    ok = await supervisor.check_action(
        "release-agent", "deploy", {"target": "production", "cost": 40}
    )
    assert ok.allowed
    assert asked == ["release-agent wants to deploy"]
    over = await supervisor.check_action("release-agent", "deploy", {"cost": 400})
    assert (over.allowed, over.reason, over.severity) == (
        False,
        "Cost 400 is over the cap",
        Severity.BLOCK,
    )
    assert asked == ["release-agent wants to deploy"]  # the cap blocked before anyone was asked


# --- patterns ------------------------------------------------------------------------------


async def test_patterns_change_at_runtime_ignoring_case() -> None:
    gate = HumanApproval({"Deploy"}, answering(False), name="ops-approval")
    assert gate.name == "ops-approval"
    assert gate.patterns == frozenset({"deploy"})
    gate.add_pattern("DELETE")
    gate.add_pattern("delete")  # already there: nothing changes
    assert gate.patterns == frozenset({"deploy", "delete"})
    assert not (await gate.check("w", "delete-user", {})).allowed
    assert gate.remove_pattern("DEPLOY") is True
    assert gate.remove_pattern("deploy") is False
    assert (await gate.check("w", "deploy", {})).allowed
    assert not (await gate.check("w", "Delete", {})).allowed


async def test_no_patterns_allows_everything_until_one_is_added() -> None:
    gate = HumanApproval([], answering(False))
    assert (await gate.check("w", "deploy", {})).allowed
    gate.add_pattern("deploy")
    assert not (await gate.check("w", "deploy", {})).allowed


async def test_a_none_context_becomes_an_empty_mapping() -> None:
    inbox = Inbox()
    task = asyncio.create_task(HumanApproval({"x"}, inbox).check("w", "x"))
    (request,) = await inbox.next()
    assert dict(request.context) == {}
    request.approve()
    await task


def noop(request: ApprovalRequest) -> None:
    return None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"patterns": "deploy"}, "patterns must be an iterable of strings, got 'deploy'"),
        ({"patterns": None}, "patterns must be an iterable of strings, got None"),
        ({"patterns": {""}}, r"patterns\[\] must be a non-empty string, got ''"),
        ({"patterns": ["ok", 3]}, r"patterns\[\] must be a non-empty string, got 3"),
        ({"on_request": "call me"}, "on_request must be callable, got 'call me'"),
        ({"name": ""}, "name must be a non-empty string, got ''"),
        ({"timeout_s": 0}, "timeout_s must be a finite number > 0 or None, got 0"),
        ({"timeout_s": -1}, "timeout_s must be a finite number > 0 or None, got -1"),
        ({"timeout_s": math.inf}, "timeout_s must be a finite number > 0 or None, got inf"),
        ({"timeout_s": math.nan}, "timeout_s must be a finite number > 0 or None, got nan"),
        ({"timeout_s": "5"}, "timeout_s must be a finite number > 0 or None, got '5'"),
        ({"clock": object()}, "clock must be a Clock"),
        ({"matches": "deploy"}, "matches must be callable, got 'deploy'"),
    ],
)
def test_constructor_refuses_bad_arguments(kwargs: dict[str, object], message: str) -> None:
    arguments: dict[str, object] = {"patterns": {"deploy"}, "on_request": noop, **kwargs}
    with pytest.raises(InvalidArgumentError, match=message) as caught:
        HumanApproval(**arguments)  # type: ignore[arg-type]
    assert caught.value.where == "HumanApproval"


@pytest.mark.parametrize("pattern", ["", "  ", None, 5])
def test_pattern_changes_refuse_bad_patterns(pattern: object) -> None:
    gate = HumanApproval({"deploy"}, noop)
    with pytest.raises(InvalidArgumentError, match="pattern must be a non-empty string"):
        gate.add_pattern(pattern)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="pattern must be a non-empty string"):
        gate.remove_pattern(pattern)  # type: ignore[arg-type]
    assert gate.patterns == frozenset({"deploy"})


async def test_check_refuses_bad_arguments() -> None:
    gate = HumanApproval({"deploy"}, noop)
    with pytest.raises(InvalidArgumentError, match="action must be a str, got 7"):
        await gate.check("w", 7, {})  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="agent_id must be a non-empty string"):
        await gate.check("", "deploy", {})


def test_repr_names_the_configuration() -> None:
    gate = HumanApproval({"b", "a"}, noop, timeout_s=3)
    assert repr(gate) == "HumanApproval(name='hitl-approval', patterns=['a', 'b'], timeout_s=3)"
    assert gate.timeout_s == 3


async def test_matches_asks_about_actions_the_patterns_do_not_cover() -> None:
    inbox = Inbox()
    gate = HumanApproval({"deploy"}, inbox, matches=lambda action: action.startswith("rm "))
    assert gate.matches("rm -rf build")
    assert gate.matches("Deploy web")  # the patterns still count
    assert not gate.matches("ls rm ")
    assert await gate.check("w", "ls rm ", {}) is GuardrailResult.allow()
    assert inbox.requests == []
    task = asyncio.create_task(gate.check("w", "rm -rf build", {}))
    (request,) = await inbox.next()
    assert request.action == "rm -rf build"
    request.approve()
    assert (await task).allowed is True


async def test_matches_alone_needs_no_patterns() -> None:
    seen: list[str] = []

    def matches(action: str) -> bool:
        seen.append(action)
        return "prod" in action  # case-sensitive: the predicate decides, not the folding

    gate = HumanApproval((), answering(False), matches=matches)
    assert (await gate.check("w", "to PROD", {})).allowed is True
    assert (await gate.check("w", "to prod", {})).allowed is False
    assert seen == ["to PROD", "to prod"]


async def test_a_raising_matches_blocks_under_a_supervisor() -> None:
    def matches(action: str) -> bool:
        raise TimeoutError("pattern took too long")

    gate = HumanApproval((), noop, matches=matches)
    with pytest.raises(TimeoutError):
        await gate.check("w", "deploy", {})
    supervisor = Supervisor(AgentGroup("team"), [gate])
    result = await supervisor.check_action("w", "deploy")
    assert result.allowed is False
    assert result.reason == "Guardrail error: pattern took too long"
    assert gate.pending == []


def test_repr_names_matches_when_given() -> None:
    def by_regex(action: str) -> bool:
        return False

    gate = HumanApproval((), noop, matches=by_regex)
    assert repr(gate).startswith("HumanApproval(name='hitl-approval', patterns=[], timeout_s=None")
    assert "matches=<function" in repr(gate)
