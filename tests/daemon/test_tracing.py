"""The daemon's spans, exported in memory: one ``openai`` turn that queries a database is
one trace, the run's: the turn, its model calls, its tool call and the gateway's query."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from corral.daemon import AgentService, OpenAIHarness, SQLiteStore
from corral.daemon._agent_tools import CorralTools
from corral.daemon._api import LocalApi
from corral.daemon._databases import Databases
from corral.gateway import GatewayError
from corral.runtime._tracing import otel_root_span_id, otel_trace_id
from tests.daemon.conftest import MakeService
from tests.support.openai_server import OpenAIServer, completion, tool_call
from tests.support.polling import settle
from tests.support.tracing import spans  # noqa: F401  (a fixture)


@pytest.fixture
async def team(
    make_service: MakeService, sqlite_store: SQLiteStore, tmp_path: Path
) -> AsyncIterator[tuple[AgentService, Databases]]:
    shop = tmp_path / "shop.db"
    with sqlite3.connect(shop) as db:
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, total REAL)")
        db.execute("INSERT INTO orders VALUES (1, 9.5)")
    service = await make_service(sqlite_store, harnesses={"openai": OpenAIHarness()})
    databases = await Databases.open({"shop": f"sqlite:///{shop}"}, service=service)
    service.use_agent_tools(CorralTools(LocalApi(service, databases)).for_agent)
    try:
        yield service, databases
    finally:
        await databases.close()


async def test_a_turn_its_calls_and_its_query_are_the_run_s_trace(
    team: tuple[AgentService, Databases],
    openai_server: OpenAIServer,
    spans: InMemorySpanExporter,  # noqa: F811
) -> None:
    service, _ = team
    query = {"request": {"sql": "SELECT total FROM orders"}}
    openai_server.enqueue(
        completion(tool_calls=[tool_call("db_query", query)], usage=(30, 5)),
        completion("the order is 9.50", usage=(50, 6)),
    )
    openai = {"baseUrl": openai_server.base_url, "model": "m", "corralTools": ["db_query"]}
    spec = {"name": "analyst", "harness": "openai", "openai": openai, "prompt": "sum orders"}
    agent = (await service.spawn(spec)).body["id"]
    await settle(lambda: service.get(agent)["state"] == "idle")
    await service.settled()
    run_id = service.get(agent)["runId"]

    finished = spans.get_finished_spans()
    by_name = {s.name: s for s in finished}
    assert {"corral.turn", f"invoke_agent {agent}", "chat", "execute_tool db_query"} <= set(by_name)
    assert "corral.gateway.query" in by_name
    assert {s.context.trace_id for s in finished} == {otel_trace_id(run_id)}

    def parent(name: str) -> str:
        found = by_name[name].parent
        assert found is not None
        (up,) = [s.name for s in finished if s.context.span_id == found.span_id] or ["<run>"]
        return up

    turn = by_name["corral.turn"]
    assert turn.parent is not None
    assert turn.parent.span_id == otel_root_span_id(run_id)
    assert parent(f"invoke_agent {agent}") == "corral.turn"
    assert parent("chat") == f"invoke_agent {agent}"
    assert parent("execute_tool db_query") == f"invoke_agent {agent}"
    assert parent("corral.gateway.query") == "execute_tool db_query"
    attributes = turn.attributes or {}
    assert attributes["corral.agent.id"] == agent
    assert attributes["corral.run.id"] == run_id
    assert (attributes["corral.turn.outcome"], attributes["corral.usage.tokens"]) == (
        "completed",
        91,
    )
    gateway = by_name["corral.gateway.query"].attributes or {}
    assert (gateway["db.system.name"], gateway["corral.gateway.outcome"]) == ("sqlite", "ok")


async def test_a_failed_turn_and_a_refused_query_are_marked(
    team: tuple[AgentService, Databases],
    openai_server: OpenAIServer,
    spans: InMemorySpanExporter,  # noqa: F811
) -> None:
    service, databases = team
    agent = (
        await service.spawn(
            {
                "name": "broken",
                "harness": "openai",
                "openai": {"baseUrl": openai_server.base_url, "model": "m"},
                "prompt": "go",
            }
        )
    ).body["id"]  # the server has nothing queued: it answers 500, the turn fails
    await settle(lambda: service.get(agent)["state"] == "failed")
    await service.settled()
    with pytest.raises(GatewayError, match="refunds"):
        await databases.query("shop", agent, {"sql": "SELECT * FROM refunds"})
    run_id = service.get(agent)["runId"]
    finished = spans.get_finished_spans()
    (turn,) = [s for s in finished if s.name == "corral.turn"]
    assert turn.status.status_code is StatusCode.ERROR
    assert (turn.attributes or {})["corral.turn.outcome"] == "failed"
    (query,) = [s for s in finished if s.name == "corral.gateway.query"]
    assert query.context.trace_id == otel_trace_id(run_id)  # outside the turn, same run
    assert (query.attributes or {})["corral.gateway.outcome"] == "unknown_table"
    assert query.status.status_code is StatusCode.ERROR


async def test_a_refused_query_s_span_holds_neither_its_statement_nor_its_values(
    team: tuple[AgentService, Databases],
    spans: InMemorySpanExporter,  # noqa: F811
) -> None:
    # The database's error message quotes the statement (here a column named like a secret):
    # the span says the outcome's code, never the message.
    service, databases = team
    agent = (
        await service.spawn(
            {"name": "q", "harness": "openai", "openai": {"baseUrl": "http://x", "model": "m"}}
        )
    ).body["id"]
    statement = "SELECT * FROM orders WHERE s3cr3t_token_abc = 1"
    with pytest.raises(GatewayError, match="s3cr3t_token_abc"):
        await databases.query("shop", agent, {"sql": statement})
    (query,) = [s for s in spans.get_finished_spans() if s.name == "corral.gateway.query"]
    assert query.status.status_code is StatusCode.ERROR
    shown = repr(
        (
            dict(query.attributes or {}),
            [(e.name, dict(e.attributes or {})) for e in query.events],
            query.status.description,
        )
    )
    assert "s3cr3t" not in shown, shown
