"""OpenAIHarness against the loopback OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest

from corral.daemon import Harness, OpenAIHarness, TurnFailedError, TurnRequest, parse_spec
from corral.kernel import ExecutionBudget, InvalidArgumentError
from tests.support.openai_server import OpenAIServer, completion, reply
from tests.support.polling import settle

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
) -> TurnRequest:
    openai: dict[str, Any] = {"baseUrl": base_url, "model": "test-model"}
    if model_options is not None:
        openai["modelOptions"] = model_options
    if price is not None:
        openai["price"] = price
    if api_key_env is not None:
        openai["apiKeyEnv"] = api_key_env
    if instructions is not None:
        openai["instructions"] = instructions
    spec = parse_spec({"name": "o", "harness": "openai", "openai": openai})
    return TurnRequest(
        agent_id="a_0000abcd",
        turn=1,
        prompt=prompt,
        spec=spec,
        workdir=tmp_path,
        state_dir=tmp_path,
        timeout_s=timeout_s,
        remaining=remaining or ExecutionBudget(),
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
