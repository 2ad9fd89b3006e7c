"""The daemon's Prometheus metrics in process: counters derived from the committed events,
gauges read from the state projection at each scrape, and who may read ``GET /metrics``."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from corral.daemon import AgentService, SQLiteStore, TurnResult, create_app
from corral.daemon._auth import agent_token
from corral.daemon._events import Event
from corral.daemon._metrics import Metrics
from tests.daemon.conftest import MakeService
from tests.support.harness import ScriptedHarness, fail
from tests.support.polling import settle

TOKEN = "metrics-test-token"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(exposition: bytes | str) -> Samples:
    """Every sample of a scrape, by name and sorted labels (parsed by prometheus-client)."""
    text = exposition.decode() if isinstance(exposition, bytes) else exposition
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(found: Samples, name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
async def service(make_service: MakeService, sqlite_store: SQLiteStore) -> AgentService:
    return await make_service(sqlite_store)


async def test_turns_spending_and_states_after_a_small_team(
    service: AgentService, harness: ScriptedHarness
) -> None:
    metrics = Metrics.of(service)
    harness.script("good", TurnResult(output="done", tokens=120, cost_usd=0.25))
    harness.script("bad", fail("no such table", tokens=30))
    harness.script("held", fail("flaky"))
    spec = {"harness": "command", "command": ["true"], "prompt": "go"}
    good = (await service.spawn({**spec, "name": "good"})).body["id"]
    bad = (await service.spawn({**spec, "name": "bad"})).body["id"]
    held = (await service.spawn({**spec, "name": "held", "onFailure": "ask"})).body["id"]
    await settle(lambda: service.get(good)["state"] == "idle")
    await settle(lambda: service.get(bad)["state"] == "failed")
    await settle(lambda: service.get(held)["state"] == "blocked")

    await service.settled()  # each turn's commit told (the state shows it a moment before)
    found = samples(metrics.exposition())
    assert value(found, "corral_turns_total", harness="command", outcome="completed") == 1
    assert value(found, "corral_turns_total", harness="command", outcome="failed") == 2
    assert value(found, "corral_turn_duration_seconds_count", harness="command") == 3
    assert value(found, "corral_tokens_total", harness="command") == 150
    assert value(found, "corral_cost_usd_total", harness="command") == 0.25
    assert value(found, "corral_agents", state="idle") == 1
    assert value(found, "corral_agents", state="failed") == 1
    assert value(found, "corral_agents", state="blocked") == 1
    assert value(found, "corral_agents", state="stopped") == 0  # every state is shown
    assert value(found, "corral_decisions_pending", kind="blocked") == 1
    assert value(found, "corral_decisions_pending", kind="approval") == 0
    assert value(found, "corral_events_total", type="agent.created") == 3
    assert value(found, "corral_turns_in_flight") == 0

    # The gauges are read at the scrape: the held agent answered and stopped moves them.
    await service.stop(held)
    found = samples(metrics.exposition())
    assert value(found, "corral_agents", state="blocked") == 0
    assert value(found, "corral_agents", state="stopped") == 1
    assert value(found, "corral_decisions_pending", kind="blocked") == 0


async def test_a_stopped_turn_counts_as_interrupted_with_what_it_spent(
    service: AgentService, harness: ScriptedHarness
) -> None:
    metrics = Metrics.of(service)
    harness.script("slow", "hang")
    slow = (
        await service.spawn(
            {"name": "slow", "harness": "command", "command": ["true"], "prompt": "wait"}
        )
    ).body["id"]
    await settle(lambda: slow in harness.running)
    assert value(samples(metrics.exposition()), "corral_turns_in_flight") == 1
    await service.stop(slow)
    found = samples(metrics.exposition())
    assert value(found, "corral_turns_total", harness="command", outcome="interrupted") == 1
    assert value(found, "corral_turns_total", harness="command", outcome="failed") == 0


async def test_event_subscribers_are_counted_while_open(service: AgentService) -> None:
    metrics = Metrics.of(service)
    stream = service.subscribe()
    reading = asyncio.ensure_future(anext(stream))
    await settle(lambda: service.subscriptions == 1)
    assert value(samples(metrics.exposition()), "corral_event_subscribers") == 1
    reading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reading
    await stream.aclose()
    assert value(samples(metrics.exposition()), "corral_event_subscribers") == 0


def event(seq: int, kind: str, agent: str, **data: object) -> Event:
    return Event(seq, f"2030-01-01T00:00:{seq:02d}+00:00", kind, agent, dict(data))


async def test_a_restart_s_interrupted_turn_counts_once_as_failed(service: AgentService) -> None:
    metrics = Metrics(service)
    metrics.observe([event(1, "agent.turn_started", "a_1", turn=1)])
    metrics.observe(
        [
            event(4, "agent.turn_interrupted", "a_1", turn=1, usage={"tokens": 7}),
            event(4, "agent.turn_failed", "a_1", turn=1, usage=None, error="restarted"),
        ]
    )
    metrics.observe([event(5, "agent.turn_interrupted", "a_2", turn=3)])
    found = samples(metrics.exposition())
    # Agents the state does not hold (deleted, another daemon's) count under "unknown".
    assert value(found, "corral_turns_total", harness="unknown", outcome="failed") == 1
    assert value(found, "corral_turns_total", harness="unknown", outcome="interrupted") == 1
    assert value(found, "corral_tokens_total", harness="unknown") == 7
    assert value(found, "corral_turn_duration_seconds_sum", harness="unknown") == 3.0
    assert value(found, "corral_turn_duration_seconds_count", harness="unknown") == 1


async def test_gateway_requests_refusals_and_freezes(service: AgentService) -> None:
    metrics = Metrics(service)
    metrics.gateway_request("shop", "ok")
    metrics.gateway_request("shop", "pool_exhausted")
    metrics.gateway_request("shop", "pool_exhausted")
    metrics.observe([event(1, "gateway.agent_frozen", "a_1", target="shop", reason="errors")])
    found = samples(metrics.exposition())
    assert value(found, "corral_gateway_requests_total", target="shop", outcome="ok") == 1
    assert (
        value(found, "corral_gateway_requests_total", target="shop", outcome="pool_exhausted") == 2
    )
    assert value(found, "corral_gateway_pool_refusals_total", target="shop") == 2
    assert value(found, "corral_gateway_freezes_total", target="shop") == 1


async def test_each_app_has_a_registry_of_its_own(service: AgentService) -> None:
    # Two apps (or daemons) in one process: no "duplicated timeseries" clash, no shared count.
    first, second = Metrics.of(service), Metrics.of(service)
    first.gateway_request("shop", "ok")
    assert (
        value(
            samples(first.exposition()),
            "corral_gateway_requests_total",
            target="shop",
            outcome="ok",
        )
        == 1
    )
    assert (
        value(
            samples(second.exposition()),
            "corral_gateway_requests_total",
            target="shop",
            outcome="ok",
        )
        == 0
    )


async def scrape(app: object, token: str | None) -> httpx.Response:
    headers = {} if token is None else {"authorization": f"Bearer {token}"}
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        return await client.get("/metrics", headers=headers)


async def test_an_operator_reads_the_metrics_and_an_agent_cannot(service: AgentService) -> None:
    agent = (await service.spawn({"name": "w", "harness": "command", "command": ["true"]})).body[
        "id"
    ]
    app = create_app(service, token=TOKEN)
    answer = await scrape(app, TOKEN)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain")
    assert value(samples(answer.text), "corral_agents", state="idle") == 1
    assert (await scrape(app, None)).status_code == 401
    refused = await scrape(app, agent_token(TOKEN, agent))
    assert (refused.status_code, refused.json()["error"]["code"]) == (403, "out_of_scope")

    public = create_app(service, token=TOKEN, metrics_public=True)
    assert (await scrape(public, None)).status_code == 200
    schema = public.openapi()
    assert schema["paths"]["/metrics"]["get"]["security"] == []
    # Only /metrics (and /healthz) is let through: everything else still needs the token.
    transport = httpx.ASGITransport(app=public)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        assert (await client.get("/agents")).status_code == 401
