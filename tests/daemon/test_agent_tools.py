"""corral's tools for an ``openai`` agent (``openai.corralTools``), called in process: the
agent's token's reach, refusals told as tool errors, the spec's rules for the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from corral.daemon import AgentService, InvalidSpecError, SQLiteStore
from corral.daemon._agent_tools import MAX_RESULT_CHARS, CorralToolError, CorralTools, shown
from corral.daemon._api import LocalApi
from corral.daemon._spec import CORRAL_TOOLS, parse_spec
from corral.daemon.harnesses import ExtraTool
from tests.daemon.conftest import MakeService
from tests.support.harness import ScriptedHarness, fail
from tests.support.polling import settle

OPENAI = {"baseUrl": "http://127.0.0.1:9/v1", "model": "m"}


@pytest.fixture
async def service(
    make_service: MakeService, sqlite_store: SQLiteStore, harness: ScriptedHarness
) -> AgentService:
    return await make_service(sqlite_store, harnesses={"command": harness, "openai": harness})


async def coordinator(service: AgentService, corral_tools: Any = True, **spec: Any) -> str:
    body = {"name": "lead", "harness": "openai", "openai": {**OPENAI, "corralTools": corral_tools}}
    return str((await service.spawn({**body, **spec})).body["id"])


def tools_of(service: AgentService, agent_id: str) -> dict[str, ExtraTool]:
    spec = parse_spec(service.get(agent_id)["spec"])
    return {t.name: t for t in CorralTools(LocalApi(service)).for_agent(agent_id, spec)}


async def test_only_the_tools_the_spec_names_are_given(service: AgentService) -> None:
    every = await coordinator(service)
    assert list(tools_of(service, every)) == list(CORRAL_TOOLS)
    some = await coordinator(service, ["inbox_read", "agent_prompt"])
    assert list(tools_of(service, some)) == ["inbox_read", "agent_prompt"]
    none = await coordinator(service, False)
    assert tools_of(service, none) == {}
    worker = str(
        (await service.spawn({"name": "w", "harness": "command", "command": ["true"]})).body["id"]
    )
    assert tools_of(service, worker) == {}
    tool = tools_of(service, every)["agent_spawn"]
    assert every in tool.description
    assert tool.parameters["type"] == "object"


async def test_a_coordinator_spawns_reads_and_reprompts_its_child(
    service: AgentService, harness: ScriptedHarness
) -> None:
    lead = await coordinator(service, mayAnswer=["blocked"])
    tools = tools_of(service, lead)
    harness.script("w", fail("no such table: refunds"), "42 rows")
    spec = {"name": "w", "harness": "command", "command": ["true"], "prompt": "count"}
    made = json.loads(await tools["agent_spawn"].call({"spec": {**spec, "onFailure": "ask"}}))
    child = made["id"]
    assert made["parent"] == lead  # the agent's own child, though the spec named no parent
    await settle(lambda: service.get(child)["state"] == "blocked")
    notices = json.loads(await tools["inbox_read"].call({}))["notices"]
    assert [(n["from"], n["kind"]) for n in notices] == [(child, "supervision")]
    status = json.loads(await tools["agent_status"].call({"agentId": child}))
    assert status["lastError"] == "no such table: refunds"
    answer = {"agentId": child, "text": "the table is called orders"}
    assert json.loads(await tools["agent_prompt"].call(answer))["accepted"] == "prompt"
    await settle(lambda: service.get(child)["state"] == "idle")
    (resolved,) = [d for d in service.decisions(resolved=True) if d["agentId"] == child]
    assert (resolved["answer"], resolved["by"]) == ("retry", lead)
    listed = json.loads(await tools["agent_list"].call({}))["agents"]
    assert sorted(a["id"] for a in listed) == sorted([lead, child])


async def test_refusals_reach_the_model_as_tool_errors_naming_the_code(
    service: AgentService, harness: ScriptedHarness
) -> None:
    lead = await coordinator(service)  # mayAnswer: none
    other = str(
        (await service.spawn({"name": "x", "harness": "command", "command": ["true"]})).body["id"]
    )
    tools = tools_of(service, lead)
    with pytest.raises(CorralToolError) as beyond:
        await tools["agent_stop"].call({"agentId": other})
    assert beyond.value.message.startswith("agent_stop: out_of_scope: ")
    assert beyond.value.details["error_code"] == "out_of_scope"
    with pytest.raises(CorralToolError) as bad:
        await tools["agent_prompt"].call({"agentId": lead, "colour": "red"})
    assert bad.value.message.startswith("agent_prompt: invalid_request: ")
    assert "colour" in bad.value.message
    harness.script("w", fail("oops"))
    spec = {"name": "w", "harness": "command", "command": ["true"], "prompt": "go"}
    child = json.loads(await tools["agent_spawn"].call({"spec": {**spec, "onFailure": "ask"}}))
    await settle(lambda: service.get(child["id"])["state"] == "blocked")
    with pytest.raises(CorralToolError) as not_granted:
        await tools["agent_prompt"].call({"agentId": child["id"], "text": "again"})
    assert "mayAnswer" in not_granted.value.message
    with pytest.raises(CorralToolError) as root:
        await tools["agent_spawn"].call({"spec": {**spec, "parent": other}})
    assert "out_of_scope" in root.value.message


def test_a_long_result_is_cut_and_says_so() -> None:
    text = shown({"x": "y" * (MAX_RESULT_CHARS + 10)})
    assert len(text) < MAX_RESULT_CHARS + 100
    assert text.endswith("more characters left out]")


@pytest.mark.parametrize(
    ("corral_tools", "tools", "message"),
    [
        (["agent_fly"], [], "must be one of"),
        (["inbox_read", "inbox_read"], [], "listed twice"),
        ("yes", [], "boolean"),
        (True, [{"name": "agent_stop", "command": ["true"]}], "corral's tools"),
    ],
)
def test_corral_tools_in_the_spec_are_checked(
    corral_tools: Any, tools: list[dict[str, Any]], message: str
) -> None:
    openai = {**OPENAI, "corralTools": corral_tools, "tools": tools}
    with pytest.raises(InvalidSpecError) as refused:
        parse_spec({"name": "x", "harness": "openai", "openai": openai})
    assert message in json.dumps(refused.value.problems)


async def test_a_model_cannot_spawn_a_child_of_higher_priority_than_its_own(
    service: AgentService,
) -> None:
    # A higher-priority helper would pause others' agents at the run's cap and take a larger
    # share of the daemon's turns than the operator gave the agent.
    lead = await coordinator(service, priority="high")
    tools = tools_of(service, lead)
    spec = {"name": "w", "harness": "command", "command": ["true"]}
    with pytest.raises(CorralToolError) as refused:
        await tools["agent_spawn"].call({"spec": {**spec, "priority": "critical"}})
    assert refused.value.details["error_code"] == "out_of_scope"
    assert "'critical'" in refused.value.message
    assert "'high'" in refused.value.message
    assert [a["id"] for a in service.list_agents()] == [lead]  # nothing made
    for priority in ("high", "normal", "low"):
        # Names are unique among a run's live agents: one helper per priority.
        named = {**spec, "name": f"w-{priority}", "priority": priority}
        made = json.loads(await tools["agent_spawn"].call({"spec": named}))
        assert made["spec"]["priority"] == priority
