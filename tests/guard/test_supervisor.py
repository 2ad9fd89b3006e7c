import asyncio
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import pytest

from corral.guard import AgentGroup, GuardrailResult, GuardrailWarning, Severity, Supervisor
from corral.kernel import ActionCheck, InvalidArgumentError

Answer = Callable[[str, str, Mapping[str, object]], Any]


class Rule:
    """A guardrail answering with ``answer`` (a value, an exception to raise, or a function)."""

    def __init__(self, name: str, answer: Any, calls: list[str] | None = None) -> None:
        self.name = name
        self.answer = answer
        self.calls = calls if calls is not None else []
        self.contexts: list[Mapping[str, object]] = []

    def check(self, agent_id: str, action: str, context: Mapping[str, object]) -> Any:
        self.calls.append(self.name)
        self.contexts.append(context)
        if isinstance(self.answer, BaseException):
            raise self.answer
        if callable(self.answer):
            return self.answer(agent_id, action, context)
        return self.answer


class AsyncRule(Rule):
    async def check(self, agent_id: str, action: str, context: Mapping[str, object]) -> Any:
        await asyncio.sleep(0)
        return super().check(agent_id, action, context)


def make(*guardrails: Any) -> Supervisor:
    return Supervisor(AgentGroup("crew", {"worker-1": object()}), guardrails)


async def test_no_guardrails_allows() -> None:
    result = await make().check_action("worker-1", "deploy")
    assert result.allowed
    assert result.severity is Severity.INFO
    assert result.warnings == ()


async def test_guardrails_run_in_order_and_the_last_result_is_returned() -> None:
    calls: list[str] = []
    last = GuardrailResult(True, "fine by the last one")
    supervisor = make(
        Rule("a", GuardrailResult.allow(), calls),
        AsyncRule("b", GuardrailResult.allow(), calls),
        Rule("c", last, calls),
    )
    result = await supervisor.check_action("worker-1", "deploy")
    assert calls == ["a", "b", "c"]
    assert result is last


async def test_first_block_returns_at_once_and_later_guardrails_do_not_run() -> None:
    calls: list[str] = []
    block = GuardrailResult.blocked("cost 400 is over the cap")
    supervisor = make(
        Rule("a", GuardrailResult.allow(), calls),
        Rule("b", block, calls),
        Rule("c", GuardrailResult.blocked("never asked"), calls),
    )
    result = await supervisor.check_action("worker-1", "deploy")
    assert result is block
    assert calls == ["a", "b"]


async def test_an_async_block_short_circuits_too() -> None:
    calls: list[str] = []
    supervisor = make(AsyncRule("a", GuardrailResult.blocked("no"), calls), Rule("b", None, calls))
    result = await supervisor.check_action("worker-1", "x")
    assert (result.allowed, result.reason) == (False, "no")
    assert calls == ["a"]


@pytest.mark.parametrize("kind", [Rule, AsyncRule])
async def test_a_raising_guardrail_blocks_with_guardrail_error(
    kind: type[Rule], caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []
    supervisor = make(kind("boom", RuntimeError("disk on fire"), calls), Rule("after", None, calls))
    with caplog.at_level(logging.ERROR, logger="corral.guard.supervisor"):
        result = await supervisor.check_action("worker-1", "deploy")
    assert result.allowed is False
    assert result.severity is Severity.BLOCK
    assert result.reason == "Guardrail error: disk on fire"
    assert calls == ["boom"]
    assert any("boom" in r.getMessage() and r.exc_info for r in caplog.records)


async def test_an_exception_without_message_is_named_by_its_type() -> None:
    result = await make(Rule("boom", KeyError())).check_action("worker-1", "deploy")
    assert result.reason == "Guardrail error: KeyError"


@pytest.mark.parametrize("answer", [None, True, "allow", {"allowed": True}])
async def test_an_answer_that_is_not_a_result_blocks_fail_closed(
    answer: object, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []
    supervisor = make(Rule("odd", answer, calls), Rule("after", GuardrailResult.allow(), calls))
    with caplog.at_level(logging.ERROR, logger="corral.guard.supervisor"):
        result = await supervisor.check_action("worker-1", "deploy")
    assert result.allowed is False
    assert result.severity is Severity.BLOCK
    assert result.reason == (
        f"Guardrail error: guardrail 'odd' answered {answer!r}, not a GuardrailResult"
    )
    assert calls == ["odd"]
    assert any("not a GuardrailResult" in r.getMessage() for r in caplog.records)


async def test_an_awaitable_answering_something_else_blocks_too() -> None:
    result = await make(AsyncRule("odd", 42)).check_action("worker-1", "deploy")
    assert result.reason == "Guardrail error: guardrail 'odd' answered 42, not a GuardrailResult"


async def test_any_awaitable_is_awaited() -> None:
    loop = asyncio.get_running_loop()

    def answer(*_: object) -> Awaitable[GuardrailResult]:
        future: asyncio.Future[GuardrailResult] = loop.create_future()
        loop.call_soon(future.set_result, GuardrailResult.blocked("via a future"))
        return future

    result = await make(Rule("future", answer)).check_action("worker-1", "deploy")
    assert result.reason == "via a future"


async def test_warnings_are_logged_collected_and_evaluation_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[str] = []
    last = GuardrailResult(True, "all good")
    supervisor = make(
        Rule("spend", GuardrailResult.warning("spend at 90%"), calls),
        AsyncRule("hours", GuardrailResult.warning("outside office hours"), calls),
        Rule("final", last, calls),
    )
    with caplog.at_level(logging.WARNING, logger="corral.guard.supervisor"):
        result = await supervisor.check_action("worker-1", "deploy")
    assert calls == ["spend", "hours", "final"]
    # The last guardrail's verdict, with every warning met on the way.
    assert (result.allowed, result.reason, result.severity) == (True, "all good", Severity.INFO)
    assert result.warnings == (
        GuardrailWarning("spend", "spend at 90%"),
        GuardrailWarning("hours", "outside office hours"),
    )
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("'spend'" in m and "spend at 90%" in m and "'worker-1'" in m for m in messages)
    assert any("'hours'" in m and "outside office hours" in m for m in messages)


async def test_the_last_guardrails_own_warning_is_kept() -> None:
    supervisor = make(Rule("a", GuardrailResult.allow()), Rule("b", GuardrailResult.warning("w")))
    result = await supervisor.check_action("worker-1", "deploy")
    assert result.severity is Severity.WARNING
    assert result.reason == "w"
    assert result.warnings == (GuardrailWarning("b", "w"),)


async def test_a_block_after_warnings_carries_them() -> None:
    supervisor = make(
        Rule("a", GuardrailResult.warning("careful")), Rule("b", GuardrailResult.blocked("stop"))
    )
    result = await supervisor.check_action("worker-1", "deploy")
    assert (result.allowed, result.reason, result.severity) == (False, "stop", Severity.BLOCK)
    assert result.warnings == (GuardrailWarning("a", "careful"),)


async def test_an_error_after_warnings_carries_them() -> None:
    supervisor = make(Rule("a", GuardrailResult.warning("careful")), Rule("b", ValueError("bad")))
    result = await supervisor.check_action("worker-1", "deploy")
    assert result.reason == "Guardrail error: bad"
    assert result.warnings == (GuardrailWarning("a", "careful"),)


async def test_warnings_inside_a_result_are_kept() -> None:
    inner = make(Rule("inner", GuardrailResult.warning("nested")))

    class Nested:
        name = "nested-supervisor"

        async def check(
            self, agent_id: str, action: str, context: Mapping[str, object]
        ) -> GuardrailResult:
            return await inner.check_action(agent_id, action, context)

    result = await make(Nested(), Rule("last", GuardrailResult.allow())).check_action("w", "x")
    assert result.warnings == (
        GuardrailWarning("inner", "nested"),
        GuardrailWarning("nested-supervisor", "nested"),
    )


async def test_context_is_handed_over_as_given_and_defaults_to_read_only_empty() -> None:
    rule = Rule("r", GuardrailResult.allow())
    supervisor = make(rule)
    context: dict[str, object] = {"cost": 40}
    await supervisor.check_action("worker-1", "deploy", context)
    await supervisor.check_action("worker-1", "deploy")
    assert rule.contexts[0] is context
    empty = rule.contexts[1]
    assert dict(empty) == {}
    with pytest.raises(TypeError):
        empty["x"] = 1  # type: ignore[index]


async def test_guardrails_see_agent_and_action() -> None:
    seen: list[tuple[str, str]] = []

    def answer(agent_id: str, action: str, _: object) -> GuardrailResult:
        seen.append((agent_id, action))
        return GuardrailResult.allow()

    # The answer is the guardrails' whether or not the agent is in the group.
    await make(Rule("r", answer)).check_action("not-a-member", "rm -rf /")
    assert seen == [("not-a-member", "rm -rf /")]


async def test_check_action_fits_the_kernel_action_check() -> None:
    supervisor = make(Rule("r", GuardrailResult.blocked("no tools today")))
    check: ActionCheck = supervisor.check_action
    verdict = check("worker-1", "tool:shell", {"argv": ["ls"]})
    assert inspect.isawaitable(verdict)
    answer = await verdict
    assert (answer.allowed, answer.reason) == (False, "no tools today")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("", "deploy", None), "agent_id must be a non-empty string, got ''"),
        ((None, "deploy", None), "agent_id must be a non-empty string, got None"),
        ((3, "deploy", None), "agent_id must be a non-empty string, got 3"),
        (("w", None, None), "action must be a str, got None"),
        (("w", b"deploy", None), "action must be a str, got b'deploy'"),
        (("w", "deploy", [("cost", 1)]), r"context must be a Mapping, got \[\('cost', 1\)\]"),
    ],
)
async def test_check_action_refuses_bad_arguments(args: tuple[Any, ...], message: str) -> None:
    rule = Rule("r", GuardrailResult.allow())
    with pytest.raises(InvalidArgumentError, match=message) as caught:
        await make(rule).check_action(*args)
    assert caught.value.where == "Supervisor.check_action"
    assert rule.calls == []


async def test_a_non_dict_mapping_context_is_accepted() -> None:
    from types import MappingProxyType

    rule = Rule("r", GuardrailResult.allow())
    result = await make(rule).check_action("w", "x", MappingProxyType({"a": 1}))
    assert result.allowed
    assert rule.contexts[0]["a"] == 1


async def test_outside_cancellation_propagates_and_is_not_a_block() -> None:
    started = asyncio.Event()

    class Hangs:
        name = "hangs"

        async def check(self, *_: object) -> GuardrailResult:
            started.set()
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

    task = asyncio.create_task(make(Hangs()).check_action("w", "x"))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_guardrail_raising_cancelled_error_is_not_turned_into_a_block() -> None:
    with pytest.raises(asyncio.CancelledError):
        await make(Rule("c", asyncio.CancelledError())).check_action("w", "x")


# --- add / remove / list -------------------------------------------------------------------


def test_add_appends_and_guardrails_is_a_copy() -> None:
    a, b = Rule("a", None), Rule("b", None)
    supervisor = make(a)
    supervisor.add_guardrail(b)
    listed = supervisor.guardrails
    assert listed == [a, b]
    listed.clear()
    assert supervisor.guardrails == [a, b]
    assert "['a', 'b']" in repr(supervisor)
    assert supervisor.group.name == "crew"


async def test_added_guardrails_take_part_in_later_checks() -> None:
    supervisor = make()
    supervisor.add_guardrail(Rule("late", GuardrailResult.blocked("added later")))
    assert (await supervisor.check_action("w", "x")).reason == "added later"


async def test_remove_guardrail_removes_by_name() -> None:
    a, b = Rule("a", GuardrailResult.blocked("a says no")), Rule("b", GuardrailResult.allow())
    supervisor = make(a, b)
    assert supervisor.remove_guardrail("a") is True
    assert supervisor.guardrails == [b]
    assert (await supervisor.check_action("w", "x")).allowed
    assert supervisor.remove_guardrail("a") is False
    assert supervisor.guardrails == [b]


def test_duplicate_names_are_refused() -> None:
    supervisor = make(Rule("cap", None))
    with pytest.raises(
        InvalidArgumentError, match="a name not already in this supervisor, got 'cap'"
    ):
        supervisor.add_guardrail(Rule("cap", None))
    assert len(supervisor.guardrails) == 1
    with pytest.raises(InvalidArgumentError, match="got 'cap'"):
        make(Rule("cap", None), Rule("cap", None))


def test_a_removed_name_can_be_added_again() -> None:
    supervisor = make(Rule("cap", None))
    supervisor.remove_guardrail("cap")
    supervisor.add_guardrail(Rule("cap", None))
    assert [g.name for g in supervisor.guardrails] == ["cap"]


@pytest.mark.parametrize("name", ["", "  ", None, 5])
def test_guardrail_names_must_be_non_empty_strings(name: object) -> None:
    with pytest.raises(InvalidArgumentError, match=r"guardrail\.name must be a non-empty string"):
        make().add_guardrail(Rule(name, None))  # type: ignore[arg-type]


def test_a_guardrail_needs_a_callable_check() -> None:
    class NoCheck:
        name = "x"

    class BadCheck:
        name = "x"
        check = "not callable"

    with pytest.raises(InvalidArgumentError, match=r"guardrail\.check must be callable, got None"):
        make().add_guardrail(NoCheck())  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=r"guardrail\.check must be callable"):
        make().add_guardrail(BadCheck())  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["", None])
def test_remove_guardrail_refuses_bad_names(name: object) -> None:
    with pytest.raises(InvalidArgumentError, match="name must be a non-empty string"):
        make().remove_guardrail(name)  # type: ignore[arg-type]


def test_constructor_refuses_bad_arguments() -> None:
    with pytest.raises(InvalidArgumentError, match=r"group must be an AgentGroup, got \{'a': 1\}"):
        Supervisor({"a": 1})  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="guardrails must be an iterable of guardrails"):
        Supervisor(AgentGroup("g"), "cost-cap")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="guardrails must be an iterable"):
        Supervisor(AgentGroup("g"), 3)  # type: ignore[arg-type]


async def test_a_check_in_flight_keeps_the_guardrails_it_started_with() -> None:
    calls: list[str] = []
    supervisor = make()

    def remove_next(*_: object) -> GuardrailResult:
        supervisor.remove_guardrail("second")
        return GuardrailResult.allow()

    supervisor.add_guardrail(Rule("first", remove_next, calls))
    supervisor.add_guardrail(Rule("second", GuardrailResult.blocked("still asked"), calls))
    result = await supervisor.check_action("w", "x")
    assert result.reason == "still asked"
    assert calls == ["first", "second"]
    assert (await supervisor.check_action("w", "x")).allowed


# --- concurrency ---------------------------------------------------------------------------


async def test_many_tasks_checking_at_once_each_get_their_own_answer() -> None:
    def by_agent(agent_id: str, action: str, _: object) -> GuardrailResult:
        n = int(agent_id.split("-")[1])
        if n % 3 == 0:
            return GuardrailResult.blocked(f"{agent_id} may not {action}")
        if n % 3 == 1:
            return GuardrailResult.warning(f"{agent_id} watched")
        return GuardrailResult.allow()

    supervisor = make(AsyncRule("yield", GuardrailResult.allow()), AsyncRule("by-agent", by_agent))
    results = await asyncio.gather(
        *(supervisor.check_action(f"agent-{n}", f"act-{n}") for n in range(300))
    )
    for n, result in enumerate(results):
        if n % 3 == 0:
            assert (result.allowed, result.reason) == (False, f"agent-{n} may not act-{n}")
        elif n % 3 == 1:
            assert result.warnings == (GuardrailWarning("by-agent", f"agent-{n} watched"),)
        else:
            assert (result.allowed, result.warnings) == (True, ())


def test_adding_from_many_threads_loses_no_guardrail() -> None:
    supervisor = make()
    start = threading.Barrier(8)

    def worker(n: int) -> None:
        start.wait()
        for i in range(100):
            supervisor.add_guardrail(Rule(f"g{n}-{i}", GuardrailResult.allow()))
        for i in range(0, 100, 2):
            assert supervisor.remove_guardrail(f"g{n}-{i}")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    names = {g.name for g in supervisor.guardrails}
    assert names == {f"g{n}-{i}" for n in range(8) for i in range(1, 100, 2)}


async def test_checks_from_other_threads_run_while_guardrails_change() -> None:
    supervisor = make(Rule("base", GuardrailResult.allow()))
    errors: list[BaseException] = []

    def checker() -> None:
        async def many() -> None:
            for _ in range(300):
                result = await supervisor.check_action("w", "x")
                assert result.allowed

        try:
            asyncio.run(many())
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=checker) for _ in range(4)]
    for t in threads:
        t.start()
    for i in range(300):
        supervisor.add_guardrail(Rule(f"extra-{i}", GuardrailResult.allow()))
        supervisor.remove_guardrail(f"extra-{i}")
    for t in threads:
        t.join()
    assert errors == []
