"""OpenAIHarness against the loopback OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from corral.daemon import (
    Harness,
    InvalidSpecError,
    OpenAIHarness,
    TurnFailedError,
    TurnRequest,
    parse_spec,
)
from corral.daemon.harnesses._process import PID_FILE
from corral.kernel import ActionCheck, ExecutionBudget, InvalidArgumentError
from tests.support.openai_server import OpenAIServer, completion, reply, tool_call
from tests.support.polling import settle
from tests.support.processes import gone, read_pids, start_time

KEY_VAR = "CORRAL_TEST_OPENAI_KEY"
PRICE = {"inputPerMtokUsd": 1.0, "outputPerMtokUsd": 2.0}


def request(
    base_url: str,
    tmp_path: Path,
    *,
    prompt: str = "summarise the logs",
    price: dict[str, float] | None = None,
    api_key_env: str | None = None,
    instructions: str | None = "be brief",
    remaining: ExecutionBudget | None = None,
    timeout_s: float = 10.0,
    model_options: dict[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
    check_action: ActionCheck | None = None,
    paused_s: Callable[[], float] | None = None,
    env: dict[str, str] | None = None,
    spec_env: dict[str, str] | None = None,
) -> TurnRequest:
    openai: dict[str, Any] = {"baseUrl": base_url, "model": "test-model"}
    if model_options is not None:
        openai["modelOptions"] = model_options
    if tools is not None:
        openai["tools"] = tools
    if price is not None:
        openai["price"] = price
    if api_key_env is not None:
        openai["apiKeyEnv"] = api_key_env
    if instructions is not None:
        openai["instructions"] = instructions
    spec = parse_spec({"name": "o", "harness": "openai", "openai": openai, "env": spec_env or {}})
    workdir = (tmp_path / "work").resolve()
    state_dir = tmp_path / "state"
    workdir.mkdir(exist_ok=True)
    state_dir.mkdir(exist_ok=True)
    return TurnRequest(
        agent_id="a_0000abcd",
        turn=1,
        prompt=prompt,
        spec=spec,
        workdir=workdir,
        state_dir=state_dir,
        env=env or {},
        timeout_s=timeout_s,
        remaining=remaining or ExecutionBudget(),
        check_action=check_action,
        paused_s=paused_s,
    )


async def test_a_turn_is_one_agent_run_with_usage_and_cost(
    openai_server: OpenAIServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_VAR, "sk-test-123")
    openai_server.enqueue(completion("all summarised", usage=(100, 20)))
    harness = OpenAIHarness()
    assert isinstance(harness, Harness)
    req = request(openai_server.base_url, tmp_path, price=PRICE, api_key_env=KEY_VAR)
    result = await harness.run_turn(req)
    assert result.output == "all summarised"
    assert result.tokens == 120
    assert result.cost_usd == pytest.approx((100 * 1.0 + 20 * 2.0) / 1_000_000)
    (sent,) = openai_server.requests
    assert sent.headers["authorization"] == "Bearer sk-test-123"
    assert sent.json["model"] == "test-model"
    assert sent.json["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "summarise the logs"},
    ]


async def test_without_a_price_the_cost_is_unknown(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    openai_server.enqueue(completion("ok", usage=(10, 5)))
    result = await OpenAIHarness().run_turn(
        request(openai_server.base_url, tmp_path, instructions=None)
    )
    assert (result.output, result.tokens, result.cost_usd) == ("ok", 15, None)
    (sent,) = openai_server.requests
    assert "authorization" not in sent.headers
    assert [m["role"] for m in sent.json["messages"]] == ["user"]


async def test_a_reply_without_text_is_an_empty_output(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    openai_server.enqueue(completion(None, usage=(1, 0)))
    result = await OpenAIHarness().run_turn(request(openai_server.base_url, tmp_path))
    assert result.output == ""


async def test_the_daemon_counts_turns_so_max_turns_is_not_passed_on(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    openai_server.enqueue(completion("still fine", usage=(1, 1)))
    req = request(openai_server.base_url, tmp_path, remaining=ExecutionBudget(max_turns=0))
    result = await OpenAIHarness().run_turn(req)
    assert result.output == "still fine"


async def test_a_server_error_is_a_failed_turn_with_the_usage_spent(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    openai_server.enqueue(reply({"error": {"message": "upstream exploded"}}, status=500))
    with pytest.raises(TurnFailedError) as caught:
        await OpenAIHarness().run_turn(request(openai_server.base_url, tmp_path, price=PRICE))
    error = caught.value
    assert "answered HTTP 500" in error.message
    assert "upstream exploded" in error.message
    assert error.details["cause"] == "model_http_error"
    assert error.retryable is True
    assert error.usage == {"tokens": 0, "costUsd": 0.0}


async def test_a_reply_past_the_budget_fails_the_turn_with_its_dimension(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    # The server ignores the cap it was sent: what it spent is counted all the same.
    openai_server.enqueue(completion("too long", usage=(100, 20_000)))
    req = request(
        openai_server.base_url, tmp_path, price=PRICE, remaining=ExecutionBudget(max_cost_usd=0.02)
    )
    with pytest.raises(TurnFailedError) as caught:
        await OpenAIHarness().run_turn(req)
    error = caught.value
    assert error.message.startswith("cost_usd budget exhausted: used 0.0401 of a limit of 0.02")
    assert (error.dimension, error.details["cause"]) == ("cost_usd", "budget_exhausted")
    assert error.usage is not None
    assert error.usage["tokens"] == 20_100
    assert error.usage["costUsd"] == pytest.approx(40_100 / 1_000_000)


async def test_a_budget_with_no_room_makes_no_call(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    req = request(openai_server.base_url, tmp_path, remaining=ExecutionBudget(max_tokens=0))
    with pytest.raises(TurnFailedError, match="tokens budget exhausted: used 0 of a limit of 0"):
        await OpenAIHarness().run_turn(req)
    assert openai_server.requests == []


async def test_a_dollar_budget_without_a_price_makes_no_call(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    req = request(openai_server.base_url, tmp_path, remaining=ExecutionBudget(max_cost_usd=1.0))
    with pytest.raises(TurnFailedError, match="its cost is unknown") as caught:
        await OpenAIHarness().run_turn(req)
    assert (caught.value.dimension, caught.value.details["cause"]) == (
        "cost_usd",
        "budget_exhausted",
    )
    assert caught.value.usage == {"tokens": 0, "costUsd": 0.0}
    assert openai_server.requests == []


async def test_a_call_whose_cap_could_pass_the_money_left_is_not_made(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    # 1,000 output tokens at $2/Mtok could cost $0.002 with $0.001 left.
    req = request(
        openai_server.base_url,
        tmp_path,
        price=PRICE,
        remaining=ExecutionBudget(max_cost_usd=0.001),
        model_options={"max_tokens": 1000, "temperature": 0},
    )
    with pytest.raises(TurnFailedError) as caught:
        await OpenAIHarness().run_turn(req)
    error = caught.value
    assert error.dimension == "cost_usd"
    assert error.message.startswith(
        "cost_usd budget: the next model call was not made: it could spend up to 0.002"
    )
    assert "and 0.001 is left" in error.message
    assert openai_server.requests == []


async def test_the_harness_caps_a_call_at_what_the_money_left_affords(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    openai_server.enqueue(completion("short", usage=(40, 10)))
    req = request(
        openai_server.base_url,
        tmp_path,
        price=PRICE,
        remaining=ExecutionBudget(max_cost_usd=0.0025),
        model_options={"temperature": 0},
    )
    result = await OpenAIHarness().run_turn(req)
    assert result.output == "short"
    (sent,) = openai_server.requests
    assert sent.json["temperature"] == 0
    cap = sent.json["max_tokens"]
    assert 1 <= cap < 1250  # what $0.0025 buys at $2/Mtok, less the input's worst case
    inputs = len(sent.body)  # every byte of the request bounds the input from above
    assert (inputs * 1.0 + cap * 2.0) / 1e6 <= 0.0025


async def test_without_a_spend_limit_no_cap_is_added(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    openai_server.enqueue(completion("ok"))
    await OpenAIHarness().run_turn(request(openai_server.base_url, tmp_path, price=PRICE))
    assert "max_tokens" not in openai_server.requests[0].json


async def test_a_missing_key_variable_is_a_failed_turn_naming_it(
    openai_server: OpenAIServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_VAR, raising=False)
    req = request(openai_server.base_url, tmp_path, api_key_env=KEY_VAR)
    with pytest.raises(TurnFailedError) as caught:
        await OpenAIHarness().run_turn(req)
    assert caught.value.message == (
        f"the API key variable {KEY_VAR!r} is not set in the daemon's environment"
    )
    assert caught.value.details["api_key_env"] == KEY_VAR
    monkeypatch.setenv(KEY_VAR, "")
    with pytest.raises(TurnFailedError, match=f"{KEY_VAR!r} is empty"):
        await OpenAIHarness().run_turn(req)
    assert openai_server.requests == []


async def test_an_unreachable_server_is_a_retryable_failed_turn(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again when the block ends: nobody listens
    with pytest.raises(TurnFailedError, match="unavailable") as caught:
        await OpenAIHarness().run_turn(request(f"http://127.0.0.1:{port}/v1", tmp_path))
    assert caught.value.details["cause"] == "model_unavailable"
    assert caught.value.retryable is True


async def test_a_slow_server_times_the_turn_out(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    openai_server.enqueue(reply(completion("late"), delay_s=10))
    req = request(openai_server.base_url, tmp_path, timeout_s=0.3)
    with pytest.raises(TurnFailedError, match=r"^turn timed out after 0.3 s$") as caught:
        await OpenAIHarness().run_turn(req)
    assert caught.value.details["timeout_s"] == 0.3
    assert caught.value.usage == {"tokens": 0, "costUsd": 0.0}


async def test_cancellation_abandons_the_call_and_propagates(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    openai_server.enqueue(reply(completion("late"), delay_s=10))
    task = asyncio.ensure_future(
        OpenAIHarness().run_turn(request(openai_server.base_url, tmp_path))
    )
    await settle(lambda: len(openai_server.requests) == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_cancelled_turn_tells_what_its_model_calls_had_spent(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    openai_server.enqueue(
        completion(tool_calls=[tool_call("noop", {})], usage=(100, 10)),
        reply(completion("late", usage=(500, 50)), delay_s=10),
    )
    told: list[dict[str, Any]] = []
    req = request(
        openai_server.base_url,
        tmp_path,
        tools=[command_tool("noop", "report")],
        price={"inputPerMtokUsd": 1.0, "outputPerMtokUsd": 2.0},
    )
    task = asyncio.ensure_future(
        OpenAIHarness().run_turn(dataclasses.replace(req, spent=lambda u: told.append(dict(u))))
    )
    await settle(lambda: len(openai_server.requests) == 2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The first call's usage, priced; the second never answered.
    assert told == [{"tokens": 110, "costUsd": pytest.approx(120 / 1e6)}]


async def test_reap_has_nothing_to_end(tmp_path: Path) -> None:
    assert await OpenAIHarness().reap("a_1", tmp_path) is False
    with pytest.raises(InvalidArgumentError, match="agent_id"):
        await OpenAIHarness().reap("  ", tmp_path)
    with pytest.raises(InvalidArgumentError, match="state_dir"):
        await OpenAIHarness().reap("a_1", None)  # type: ignore[arg-type]


async def test_run_turn_refuses_what_is_not_an_openai_turn(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="request must be a TurnRequest"):
        await OpenAIHarness().run_turn({"prompt": "x"})  # type: ignore[arg-type]
    spec = parse_spec({"name": "c", "harness": "command", "command": ["true"]})
    other = TurnRequest(
        agent_id="a_1", turn=1, prompt="x", spec=spec, workdir=tmp_path, state_dir=tmp_path
    )
    with pytest.raises(InvalidArgumentError, match="a spec of harness 'openai'"):
        await OpenAIHarness().run_turn(other)


# --- tools ---------------------------------------------------------------------------------

TOOL_WORKER = str(Path(__file__).with_name("workers") / "tool_worker.py")


def command_tool(name: str, *args: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "command": [sys.executable, TOOL_WORKER, *args], **fields}


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reason: str | None = None


class Checks:
    """A ``check_action`` that answers ``verdict`` and records what it was asked."""

    def __init__(self, verdict: Verdict) -> None:
        self.verdict = verdict
        self.asked: list[tuple[str, str, dict[str, object]]] = []

    async def __call__(self, agent_id: str, action: str, context: dict[str, object]) -> Verdict:
        self.asked.append((agent_id, action, context))
        return self.verdict


def tool_messages(sent: Any) -> list[dict[str, Any]]:
    return [m for m in sent.json["messages"] if m["role"] == "tool"]


async def test_a_tool_call_runs_its_command_in_the_agents_directory_and_environment(
    openai_server: OpenAIServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("T_DAEMON", "daemon")
    parameters = {"type": "object", "properties": {"table": {"type": "string"}}}
    tools = [
        command_tool(
            "inspect",
            "report",
            "T_DAEMON",
            "T_SPEC",
            "CORRAL_AGENT_ID",
            description="look at a table",
            parameters=parameters,
        )
    ]
    openai_server.enqueue(
        completion(tool_calls=[tool_call("inspect", {"table": "users"}, id="call_a")]),
        completion("users has 3 rows"),
    )
    req = request(
        openai_server.base_url,
        tmp_path,
        tools=tools,
        spec_env={"T_SPEC": "spec", "CORRAL_AGENT_ID": "spec"},
        env={"CORRAL_AGENT_ID": "a_0000abcd"},
    )
    result = await OpenAIHarness().run_turn(req)
    assert result.output == "users has 3 rows"
    first, second = openai_server.requests
    assert first.json["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "inspect",
                "description": "look at a table",
                "parameters": parameters,
            },
        }
    ]
    (answer,) = tool_messages(second)
    assert answer["tool_call_id"] == "call_a"
    report = json.loads(answer["content"])
    assert report == {
        "arguments": {"table": "users"},
        "cwd": str(req.workdir),
        "env": {"T_DAEMON": "daemon", "T_SPEC": "spec", "CORRAL_AGENT_ID": "a_0000abcd"},
    }
    assert not (req.state_dir / PID_FILE).exists()


async def test_a_tool_without_parameters_is_offered_an_empty_object_schema(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    openai_server.enqueue(completion("no need"))
    req = request(openai_server.base_url, tmp_path, tools=[command_tool("noop", "report")])
    await OpenAIHarness().run_turn(req)
    (offered,) = openai_server.requests[0].json["tools"]
    assert offered["function"]["parameters"] == {"type": "object", "properties": {}}
    assert offered["function"]["description"] == ""


async def test_a_blocked_tool_call_does_not_run_and_the_model_is_told(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    checks = Checks(Verdict(False, "deploys need a person"))
    openai_server.enqueue(
        completion(tool_calls=[tool_call("deploy", {"path": "deployed"}, id="call_d")]),
        completion("I was not allowed to deploy"),
    )
    req = request(
        openai_server.base_url,
        tmp_path,
        tools=[command_tool("deploy", "touch")],
        check_action=checks,
    )
    result = await OpenAIHarness().run_turn(req)
    assert result.output == "I was not allowed to deploy"
    assert not (req.workdir / "deployed").exists()  # the command would have made it
    ((agent_id, action, context),) = checks.asked
    assert (agent_id, action) == ("a_0000abcd", 'deploy {"path": "deployed"}')
    assert (context["tool"], context["arguments"]) == ("deploy", {"path": "deployed"})
    (answer,) = tool_messages(openai_server.requests[1])
    assert answer["tool_call_id"] == "call_d"
    assert answer["content"] == "tool 'deploy' refused: deploys need a person"


async def test_an_allowed_tool_call_runs(openai_server: OpenAIServer, tmp_path: Path) -> None:
    checks = Checks(Verdict(True))
    openai_server.enqueue(
        completion(tool_calls=[tool_call("deploy", {"path": "deployed"})]),
        completion("deployed"),
    )
    req = request(
        openai_server.base_url,
        tmp_path,
        tools=[command_tool("deploy", "touch")],
        check_action=checks,
    )
    assert (await OpenAIHarness().run_turn(req)).output == "deployed"
    assert (req.workdir / "deployed").read_text() == "made by the tool\n"
    assert [action for _, action, _ in checks.asked] == ['deploy {"path": "deployed"}']
    (answer,) = tool_messages(openai_server.requests[1])
    assert answer["content"] == "made deployed\n"


async def test_a_check_that_raises_refuses_the_call(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    def check(agent_id: str, action: str, context: dict[str, object]) -> Verdict:
        raise RuntimeError("the inbox is down")

    openai_server.enqueue(
        completion(tool_calls=[tool_call("deploy", {"path": "deployed"})]),
        completion("gave up"),
    )
    req = request(
        openai_server.base_url,
        tmp_path,
        tools=[command_tool("deploy", "touch")],
        check_action=check,
    )
    assert (await OpenAIHarness().run_turn(req)).output == "gave up"
    assert not (req.workdir / "deployed").exists()
    (answer,) = tool_messages(openai_server.requests[1])
    assert "the guard check raised RuntimeError: the inbox is down" in answer["content"]


class PersonInTheLoop:
    """A ``check_action`` that takes ``answer_after_s`` to allow, as a person would, and the
    ``paused_s`` the daemon would give the turn meanwhile."""

    def __init__(self, answer_after_s: float) -> None:
        self.answer_after_s = answer_after_s
        self.closed = 0.0
        self.since: float | None = None

    async def check(self, agent_id: str, action: str, context: dict[str, object]) -> Verdict:
        self.since = time.monotonic()
        try:
            await asyncio.sleep(self.answer_after_s)  # the person thinking it over
        finally:
            self.closed += time.monotonic() - self.since
            self.since = None
        return Verdict(True, "approved")

    def paused_s(self) -> float:
        running = 0.0 if self.since is None else time.monotonic() - self.since
        return self.closed + running


async def test_waiting_on_a_person_past_the_turn_timeout_does_not_time_the_turn_out(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    person = PersonInTheLoop(answer_after_s=1.0)
    openai_server.enqueue(
        completion(tool_calls=[tool_call("deploy", {"path": "deployed"})]),
        completion("deployed after approval"),
    )
    req = request(
        openai_server.base_url,
        tmp_path,
        tools=[command_tool("deploy", "touch")],
        check_action=person.check,
        paused_s=person.paused_s,
        timeout_s=0.4,
    )
    result = await OpenAIHarness().run_turn(req)
    assert result.output == "deployed after approval"
    assert (req.workdir / "deployed").exists()
    assert person.paused_s() >= 1.0


async def test_the_same_wait_without_paused_s_times_the_turn_out(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    person = PersonInTheLoop(answer_after_s=1.0)
    openai_server.enqueue(completion(tool_calls=[tool_call("deploy", {"path": "deployed"})]))
    req = request(
        openai_server.base_url,
        tmp_path,
        tools=[command_tool("deploy", "touch")],
        check_action=person.check,
        timeout_s=0.4,
    )
    with pytest.raises(TurnFailedError, match=r"^turn timed out after 0.4 s$"):
        await OpenAIHarness().run_turn(req)
    assert not (req.workdir / "deployed").exists()


async def test_tool_output_past_the_cap_is_dropped_and_said(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    openai_server.enqueue(completion(tool_calls=[tool_call("dump")]), completion("read it"))
    req = request(openai_server.base_url, tmp_path, tools=[command_tool("dump", "big", "1000")])
    await OpenAIHarness(tool_output_bytes=100).run_turn(req)
    (answer,) = tool_messages(openai_server.requests[1])
    assert answer["content"] == (
        "o" * 100 + "\n[corral: output truncated: kept the first 100 bytes, dropped 900 more]\n"
    )


async def test_a_tool_that_exits_non_zero_is_an_error_the_model_is_told_about(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    openai_server.enqueue(
        completion(tool_calls=[tool_call("migrate", {"table": "users"})]),
        completion("the migration failed, stopping"),
    )
    req = request(openai_server.base_url, tmp_path, tools=[command_tool("migrate", "fail", "3")])
    result = await OpenAIHarness().run_turn(req)
    assert result.output == "the migration failed, stopping"  # the run went on
    (answer,) = tool_messages(openai_server.requests[1])
    assert answer["content"] == (
        "error: tool 'migrate': command exited with code 3; last 2048 bytes of stderr:\n"
        'broken: {"table": "users"}'
    )


async def test_a_tool_command_that_cannot_start_is_an_error_the_model_is_told_about(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    missing = str(tmp_path / "no-such-tool")
    openai_server.enqueue(completion(tool_calls=[tool_call("gone")]), completion("no tool"))
    req = request(openai_server.base_url, tmp_path, tools=[{"name": "gone", "command": [missing]}])
    assert (await OpenAIHarness().run_turn(req)).output == "no tool"
    (answer,) = tool_messages(openai_server.requests[1])
    assert answer["content"].startswith(
        f"error: tool 'gone': could not start command {missing!r}: FileNotFoundError"
    )


async def test_a_turn_timeout_kills_the_running_tools_process_group(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    openai_server.enqueue(completion(tool_calls=[tool_call("wait")]))
    req = request(
        openai_server.base_url, tmp_path, tools=[command_tool("wait", "hang")], timeout_s=1.0
    )
    with pytest.raises(TurnFailedError, match=r"^turn timed out after 1 s$"):
        await OpenAIHarness().run_turn(req)
    pids = read_pids(req.workdir)
    await settle(lambda: gone(pids["child"]) and gone(pids["grandchild"]))
    assert not (req.state_dir / PID_FILE).exists()


async def test_cancelling_the_turn_kills_the_running_tool_and_reap_knows_its_pid(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    openai_server.enqueue(completion(tool_calls=[tool_call("wait")]))
    req = request(openai_server.base_url, tmp_path, tools=[command_tool("wait", "hang")])
    task = asyncio.ensure_future(OpenAIHarness().run_turn(req))
    await settle(lambda: (req.workdir / "pids.json").exists())
    pids = read_pids(req.workdir)
    recorded = json.loads((req.state_dir / PID_FILE).read_text())
    assert (recorded["pid"], recorded["agentId"], recorded["tool"]) == (
        pids["child"],
        "a_0000abcd",
        "wait",
    )
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await settle(lambda: gone(pids["child"]) and gone(pids["grandchild"]))
    assert not (req.state_dir / PID_FILE).exists()


@pytest.fixture
def leftover() -> Iterator[subprocess.Popen[bytes]]:
    """A process in a session of its own, as a tool's command is; killed after the test."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


async def test_reap_ends_a_tool_left_by_a_crashed_daemon(
    tmp_path: Path, leftover: subprocess.Popen[bytes]
) -> None:
    record = {"pid": leftover.pid, "startTime": start_time(leftover.pid)}
    (tmp_path / PID_FILE).write_text(json.dumps(record))
    assert await OpenAIHarness().reap("a_1", tmp_path) is True
    assert leftover.wait(timeout=5) == -signal.SIGKILL
    assert not (tmp_path / PID_FILE).exists()


def test_tool_options_are_checked() -> None:
    with pytest.raises(InvalidArgumentError, match="tool_output_bytes"):
        OpenAIHarness(tool_output_bytes=0)
    with pytest.raises(InvalidArgumentError, match="tool_drain_s"):
        OpenAIHarness(tool_drain_s=-1)


# --- tool specs ----------------------------------------------------------------------------


def spec_with_tools(tools: Any) -> dict[str, Any]:
    openai = {"baseUrl": "http://127.0.0.1:1/v1", "model": "m", "tools": tools}
    return {"name": "o", "harness": "openai", "openai": openai}


def ok_tool(name: str = "t", **fields: Any) -> dict[str, Any]:
    return {"name": name, "command": ["tool"], **fields}


@pytest.mark.parametrize(
    ("tools", "field", "words"),
    [
        pytest.param([ok_tool("a b")], "openai.tools.0.name", "letters, digits", id="space"),
        pytest.param([ok_tool("")], "openai.tools.0.name", "1 to 64", id="empty"),
        pytest.param([ok_tool("x" * 65)], "openai.tools.0.name", "1 to 64", id="long"),
        pytest.param([ok_tool("ok\n")], "openai.tools.0.name", "letters", id="newline"),
        pytest.param([ok_tool("dé")], "openai.tools.0.name", "letters", id="non-ascii"),
        pytest.param([ok_tool("t\0")], "openai.tools.0.name", "letters", id="nul-name"),
        pytest.param([ok_tool(), ok_tool()], "openai.tools", "unique", id="duplicate"),
        pytest.param([ok_tool(command=["ru\0n"])], "openai.tools.0.command", "NUL", id="nul-argv"),
        pytest.param([ok_tool(command=["run", ""])], "openai.tools.0.command", "[1] is empty"),
        pytest.param([ok_tool(command=[])], "openai.tools.0.command", "at least 1"),
        pytest.param([{"name": "t"}], "openai.tools.0.command", "required", id="no-command"),
        pytest.param([ok_tool(command="run")], "openai.tools.0.command", "list", id="str-argv"),
        pytest.param(
            [ok_tool(parameters={"type": "array"})],
            "openai.tools.0.parameters",
            '"type": "object"',
            id="array-schema",
        ),
        pytest.param(
            [ok_tool(parameters={"type": "object", "properties": []})],
            "openai.tools.0.parameters",
            '"properties" must be an object',
            id="properties-list",
        ),
        pytest.param(
            [ok_tool(parameters={"type": "object", "description": "x" * 70_000})],
            "openai.tools.0.parameters",
            "at most 65536 bytes",
            id="huge-schema",
        ),
        pytest.param(
            [ok_tool(description="d" * 5000)],
            "openai.tools.0.description",
            "at most 4096",
            id="long-description",
        ),
        pytest.param([ok_tool(shell=True)], "openai.tools.0.shell", "unknown field", id="extra"),
        pytest.param([ok_tool(str(i)) for i in range(33)], "openai.tools", "at most 32"),
        pytest.param({"t": ["x"]}, "openai.tools", "list", id="not-a-list"),
    ],
)
def test_hostile_tool_specs_are_refused_with_the_problem_named(
    tools: Any, field: str, words: str
) -> None:
    with pytest.raises(InvalidSpecError) as caught:
        parse_spec(spec_with_tools(tools))
    (problem,) = caught.value.problems
    assert problem["field"] == field
    assert words in problem["message"]


def test_a_lone_surrogate_in_a_tool_is_refused() -> None:
    with pytest.raises(InvalidSpecError) as caught:
        parse_spec(spec_with_tools([ok_tool(description="\ud800")]))
    (problem,) = caught.value.problems
    assert problem["field"] == "openai.tools.0.description"
    assert "unicode string" in problem["message"]
    with pytest.raises(InvalidSpecError) as caught:
        parse_spec(spec_with_tools([ok_tool(parameters={"type": "object", "x": "\udfff"})]))
    (problem,) = caught.value.problems
    assert problem["field"] == "openai.tools.0.parameters.x"
    assert "lone surrogates" in problem["message"]


def test_tools_are_only_for_the_openai_harness_spec_and_kept_as_given() -> None:
    tools = [ok_tool("run-1_A", description="runs", parameters={"type": "object"})]
    spec = parse_spec(spec_with_tools(tools))
    assert spec.openai is not None
    (kept,) = spec.openai.tools
    assert (kept.name, kept.description, kept.parameters, kept.command) == (
        "run-1_A",
        "runs",
        {"type": "object"},
        ["tool"],
    )
    assert spec.to_json()["openai"]["tools"] == [
        {
            "name": "run-1_A",
            "description": "runs",
            "parameters": {"type": "object"},
            "command": ["tool"],
        }
    ]


async def test_model_and_tool_calls_go_to_the_turns_log(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    from corral.daemon._turn_log import TurnLog

    openai_server.enqueue(
        completion(tool_calls=[tool_call("say", {"x": 1}, id="call_s")], usage=(10, 2)),
        completion("all done", usage=(20, 3)),
    )
    req = request(openai_server.base_url, tmp_path, tools=[command_tool("say", "report")])
    log = TurnLog("a_0000abcd", 1)
    result = await OpenAIHarness().run_turn(dataclasses.replace(req, log=log))
    assert result.output == "all done"
    log.close()
    lines = [(e["stream"], e["text"]) for e in log.snapshot()]
    assert [stream for stream, _ in lines] == ["model", "tool", "model"]
    assert "12 tokens" in lines[0][1]
    assert "tool calls: say" in lines[0][1]
    assert lines[1][1].startswith('say {"x": 1}\nsay -> ')
    assert lines[2][1].endswith("23 tokens, unknown: all done\n")
