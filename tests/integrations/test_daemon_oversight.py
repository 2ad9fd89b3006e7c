"""Each framework's agent, in this process, under the oversight of a real ``corral serve``:
registered as an agent of harness ``external``, its adapter given ``Oversight.connected(handle)``,
each run one of its turns. A person (a named operator token, ``alice``) answers its tool
calls from the daemon's decisions while the call waits -- approved, the tool ran; denied, the
model read the refusal and the tool did not run -- and the daemon shows the decisions with
her name, the turns with their usage and the agent idle. A ``corral stop`` abandons a run in
flight through the handle's cancellation.

Pydantic AI runs examples/integrations/connected_agent.py's ``run_turn`` (the code
docs/integrations.md shows); the OpenAI Agents SDK and LangChain run the same turn written
for them here. Test doubles only: Pydantic AI's ``FunctionModel``, the SDK's
``ScriptedModel``, a scripted LangChain chat model. One daemon serves every test (it takes
seconds to start); each test has agents of its own.
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import sys
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any

import agents
import httpx
import pytest
from agents import RunConfig, Usage, function_tool
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call
from examples.integrations import connected_agent as example
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import StructuredTool
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from corral.client import AgentHandle, Connection, DaemonRefusedError, connect
from corral.integrations import Oversight
from corral.integrations.langchain import CorralMiddleware
from corral.integrations.openai_agents import CorralRunner
from corral.integrations.pydantic_ai import CorralCapability
from corral.kernel import CancellationError
from corral.runtime import BudgetUsage
from tests.support.front_door import serve_env
from tests.support.langchain_models import ScriptedChatModel, call_tool, last_tool_result
from tests.support.serve_process import WAIT_BOUND_S, ServeProcess

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "integrations" / "connected_agent.py"

pytestmark = pytest.mark.timeout(90)  # the first test waits for the daemon to start

PERSON = "alice"
RunTurn = Callable[[AgentHandle, str, Any], Coroutine[Any, Any, tuple[str, BudgetUsage]]]


# --- the daemon, the agent's connection, the person -------------------------------------------


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """``corral serve`` fronting one database, ``shop`` (a users table), for the gateway."""
    tmp = tmp_path_factory.mktemp("serve")
    with sqlite3.connect(tmp / "shop.db") as db:
        db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT)")
        db.execute("INSERT INTO users VALUES (1, 'ada@example.com')")
    with ServeProcess(tmp, "--db", f"shop=sqlite:///{tmp / 'shop.db'}") as served:
        yield served


@pytest.fixture(scope="module")
def person_token(daemon: ServeProcess) -> str:
    """Alice's own operator token (``corral token create alice``): what she answers is
    recorded under her name."""
    with daemon.client() as api:
        made = api.post("/tokens", json={"name": PERSON})
        assert made.status_code == 201, made.text
        return str(made.json()["token"])


@pytest.fixture
async def conn(daemon: ServeProcess) -> AsyncIterator[Connection]:
    async with connect(daemon.url, daemon.token, retry_s=5) as opened:
        yield opened


@pytest.fixture
async def person(daemon: ServeProcess, person_token: str) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"authorization": f"Bearer {person_token}"}
    async with httpx.AsyncClient(base_url=daemon.url, headers=headers, timeout=WAIT_BOUND_S) as c:
        yield c


@pytest.fixture(autouse=True)
def payments(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The example's payment system, empty for each test (every framework's ``refund`` tool
    is the example's function)."""
    refunded: list[int] = []
    monkeypatch.setattr(example, "refunded", refunded)
    agents.set_tracing_disabled(True)  # the SDK exports nothing
    return refunded


async def register(conn: Connection, name: str) -> AgentHandle:
    return await conn.register(
        name,
        guardrails=[{"match": "refund", "verdict": "ask", "timeoutS": 60}],
        budget={"maxTokens": 100_000, "maxCostUsd": 1.0},
        reuse=False,
    )


async def answer_the_approval(
    person: httpx.AsyncClient, agent_id: str, answer: str, why: str
) -> dict[str, Any]:
    """Find the agent's pending approval in the decisions inbox (polled, bounded) and answer
    it as the person."""
    async with asyncio.timeout(WAIT_BOUND_S):
        while True:
            found = (await person.get("/decisions")).json()["decisions"]
            mine = [d for d in found if d["agentId"] == agent_id and d["kind"] == "approval"]
            if mine:
                break
            await asyncio.sleep(0.02)
    asked: dict[str, Any] = mine[0]
    assert len(mine) == 1, mine
    answered = await person.post(f"/decisions/{asked['id']}", json={"answer": answer, "why": why})
    assert answered.status_code == 200, answered.text
    return asked


# --- the same turn in the other two frameworks (Pydantic AI's is the example's) -----------------


def _order(text: str) -> int:
    return int(re.findall(r"\d+", text)[-1])


class OpenAIStandIn(ScriptedModel):
    """The SDK's scripted model, priced as gpt-4o: refund the order the prompt names, then say
    what the tool said."""

    model = "gpt-4o"

    def __init__(self, *steps: ModelStep) -> None:
        super().__init__(steps or [ModelStep.respond(self.ask), ModelStep.respond(self.report)])
        self.set_default_usage(
            Usage(requests=1, input_tokens=120, output_tokens=30, total_tokens=150)
        )

    @staticmethod
    def ask(call: ModelCall) -> list[Any]:
        prompt = call.input if isinstance(call.input, str) else call.input[0]["content"]
        return [function_call("refund", {"order_id": _order(str(prompt))}, call_id="call_1")]

    @staticmethod
    def report(call: ModelCall) -> list[Any]:
        said = [i for i in call.input if isinstance(i, dict) and "output" in i]
        return [assistant_message(f"the tool said: {said[-1]['output']}")]


async def openai_agents_turn(
    handle: AgentHandle, prompt: str, model: OpenAIStandIn
) -> tuple[str, BudgetUsage]:
    async with handle.turn(prompt) as turn:
        corral = CorralRunner(
            Oversight.connected(handle, budget=turn.remaining, prices=example.PRICES)
        )
        agent = agents.Agent(name="support", model=model, tools=[function_tool(example.refund)])
        try:
            result = await corral.run(agent, turn.text, run_config=RunConfig(tracing_disabled=True))
        finally:
            spent = corral.usage()
            turn.record(tokens=spent.tokens, cost_usd=spent.cost_usd)
        output = turn.output = str(result.final_output)
    return output, spent


def langchain_stand_in() -> ScriptedChatModel:
    """Refund the order the prompt names, then say what the tool said."""

    def script(n: int, messages: Sequence[BaseMessage]) -> AIMessage:
        if n == 1:
            prompt = [m for m in messages if isinstance(m, HumanMessage)][-1].text
            return call_tool("refund", {"order_id": _order(prompt)})
        return AIMessage(content=f"the tool said: {last_tool_result(messages)}")

    return ScriptedChatModel(script=script, model_name="gpt-4o")


async def langchain_turn(
    handle: AgentHandle, prompt: str, model: BaseChatModel
) -> tuple[str, BudgetUsage]:
    async with handle.turn(prompt) as turn:
        corral = CorralMiddleware(
            Oversight.connected(handle, budget=turn.remaining, prices=example.PRICES)
        )
        refund = StructuredTool.from_function(coroutine=example.refund)
        agent = create_agent(model, tools=[refund], middleware=[corral])
        try:
            result = await agent.ainvoke({"messages": [{"role": "user", "content": turn.text}]})
        finally:
            spent = corral.oversight.usage()
            turn.record(tokens=spent.tokens, cost_usd=spent.cost_usd)
        output = turn.output = str(result["messages"][-1].text)
    return output, spent


FRAMEWORKS: dict[str, tuple[RunTurn, Callable[[], Any]]] = {
    "pydantic_ai": (example.run_turn, example.stand_in),
    "openai_agents": (openai_agents_turn, OpenAIStandIn),
    "langchain": (langchain_turn, langchain_stand_in),
}


# --- a person answers through the daemon -------------------------------------------------------


@pytest.mark.parametrize("framework", list(FRAMEWORKS))
async def test_a_person_approves_one_refund_and_denies_the_next_through_the_daemon(
    conn: Connection, person: httpx.AsyncClient, payments: list[int], framework: str
) -> None:
    run_turn, stand_in = FRAMEWORKS[framework]
    agent = await register(conn, f"support-{framework}")

    # approved: the call waited for alice, then the tool ran and the model read its result
    running = asyncio.create_task(run_turn(agent, "refund order 7", stand_in()))
    asked = await answer_the_approval(person, agent.id, "approve", "the parcel came back")
    assert asked["action"] == 'refund {"order_id": 7}'
    approved, first = await running
    assert approved == "the tool said: order 7 refunded"
    assert payments == [7]

    # denied: the model read the refusal with alice's reason; the tool did not run
    running = asyncio.create_task(run_turn(agent, "refund order 8", stand_in()))
    await answer_the_approval(person, agent.id, "deny", "order 8 was never paid")
    denied, second = await running
    assert "denied by alice: order 8 was never paid" in denied
    assert payments == [7]

    # what the daemon shows: the decisions under alice's name, the turns with their usage
    resolved = (await person.get("/decisions", params={"resolved": "true"})).json()["decisions"]
    mine = [d for d in resolved if d["agentId"] == agent.id]
    assert [(d["action"], d["answer"], d["by"], d["why"]) for d in mine] == [
        ('refund {"order_id": 8}', "deny", PERSON, "order 8 was never paid"),
        ('refund {"order_id": 7}', "approve", PERSON, "the parcel came back"),
    ]
    turns = (await person.get(f"/agents/{agent.id}/turns")).json()["turns"]
    assert [(t["turn"], t["outcome"], t["prompt"]) for t in turns] == [
        (2, "succeeded", "refund order 8"),
        (1, "succeeded", "refund order 7"),
    ]
    for row, spent in zip(turns, [second, first], strict=True):
        assert spent.tokens > 0
        assert spent.cost_usd > 0
        assert (row["usage"]["tokens"], row["usage"]["costUsd"]) == pytest.approx(
            (spent.tokens, spent.cost_usd)
        )
    record = await agent.get()
    assert (record["state"], record["turns"], record["lastOutput"]) == ("idle", 2, denied)
    assert record["usage"]["tokens"] == first.tokens + second.tokens


# --- corral stop reaches the run in flight -------------------------------------------------------


class Hang:
    """A model call that never answers: ``started`` once it is waiting, ``abandoned`` once it
    was cancelled."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.abandoned = False

    async def forever(self) -> Any:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.abandoned = True
            raise

    def model(self, framework: str) -> Any:
        if framework == "pydantic_ai":

            async def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
                return await self.forever()  # type: ignore[no-any-return]

            return FunctionModel(answer, model_name="gpt-4o")
        if framework == "openai_agents":

            async def respond(call: ModelCall) -> list[Any]:
                return await self.forever()  # type: ignore[no-any-return]

            return OpenAIStandIn(ModelStep.respond(respond))
        scripted = ScriptedChatModel(
            script=lambda n, messages: AIMessage(content="never"),
            model_name="gpt-4o",
            hang=True,
            started=self.started,
        )
        return scripted


@pytest.mark.parametrize("framework", list(FRAMEWORKS))
async def test_corral_stop_abandons_the_model_call_in_flight(
    conn: Connection, person: httpx.AsyncClient, framework: str
) -> None:
    run_turn, _ = FRAMEWORKS[framework]
    agent = await register(conn, f"stopped-{framework}")
    hang = Hang()
    running = asyncio.create_task(run_turn(agent, "refund order 9", hang.model(framework)))
    async with asyncio.timeout(WAIT_BOUND_S):
        await hang.started.wait()
    stopped = await person.post(f"/agents/{agent.id}/stop", json={"why": "wrong customer"})
    assert stopped.status_code == 202, stopped.text

    with pytest.raises(CancellationError) as ended:
        await running
    # who and why, when the handle's watch saw the stop as it happened (its event); "stopped"
    # alone when it started watching after it (the agent's record does not say who)
    assert re.search(
        rf"agent {agent.id} was stopped (by {PERSON} )?in the daemon", ended.value.message
    ), ended.value.message
    if framework != "langchain":  # the scripted chat model does not say
        assert hang.abandoned
    (row,) = (await person.get(f"/agents/{agent.id}/turns")).json()["turns"]
    assert (row["turn"], row["outcome"]) == (1, "interrupted")
    assert (await agent.get())["state"] == "stopped"


# --- the daemon's gateway as a tool -------------------------------------------------------------


async def test_the_daemons_gateway_is_the_agents_db_query_tool(
    conn: Connection, person: httpx.AsyncClient
) -> None:
    agent = await register(conn, "analyst")
    queries = [{"sql": "SELECT emial FROM users"}, {"sql": "SELECT email FROM users"}]
    answers: list[Any] = []

    def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        said = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        answers[:] = [json.loads(str(p.content)) for p in said]
        if len(said) < len(queries):
            request = queries[len(said)]
            return ModelResponse(parts=[ToolCallPart("db_query", {"request": request})])
        return ModelResponse(parts=[TextPart(answers[-1]["rows"][0]["email"])])

    async with agent.turn("what is the user's email?") as turn:
        corral = CorralCapability(
            Oversight.connected(agent, gateway=agent, budget=turn.remaining, prices=example.PRICES)
        )
        result = await Agent(FunctionModel(script, model_name="gpt-4o"), capabilities=[corral]).run(
            turn.text
        )
        turn.output = result.output
    refused, read = answers
    assert (refused["error"], refused["details"]["suggestions"]) == ("unknown_column", ["email"])
    assert read["rows"] == [{"email": "ada@example.com"}]
    assert result.output == "ada@example.com"
    # the queries were the agent's own: its breaker in that database counted the refusal,
    # also one made through a handle that names the agent instead of giving its id
    with pytest.raises(DaemonRefusedError) as again:
        await conn.agent("analyst").query("analyst", queries[0])
    assert again.value.code == "unknown_column"
    status = (await person.get(f"/gateway/shop/agents/{agent.id}")).json()
    assert status["counts"]["refusals"] == 2, status


# --- the example, as a process of its own, and as the docs show it --------------------------------


async def test_the_example_runs_as_a_process_a_person_answers(
    daemon: ServeProcess, person: httpx.AsyncClient
) -> None:
    env = serve_env(CORRAL_URL=daemon.url, CORRAL_TOKEN=daemon.token)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLE),
        "refund order 11",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(WAIT_BOUND_S):
            while True:  # registered once its imports are done
                listed = (await person.get("/agents", params={"name": "support"})).json()
                if listed["agents"]:
                    break
                await asyncio.sleep(0.05)
        (agent,) = listed["agents"]
        await answer_the_approval(person, agent["id"], "approve", "a regular customer")
        async with asyncio.timeout(WAIT_BOUND_S):
            out, err = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert lines[0] == "the tool said: order 11 refunded"
    assert re.fullmatch(r"spent: \d+ tokens, \$0\.000\d+", lines[1]), lines
    record = (await person.get(f"/agents/{agent['id']}")).json()
    assert (record["spec"]["harness"], record["state"], record["turns"]) == ("external", "idle", 1)


def test_the_docs_show_the_example_as_it_is() -> None:
    docs = (ROOT / "docs" / "integrations.md").read_text()
    section = docs.split("\n## Connected to the daemon\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    framework = [b for b in blocks if "CorralCapability(" in b]
    assert len(framework) == 1
    assert framework[0] in EXAMPLE.read_text()
    assert "Oversight.connected(handle" in framework[0]
