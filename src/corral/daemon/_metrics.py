"""The daemon's Prometheus metrics (``GET /metrics``), in a registry of its own.

Two sources, so nothing is kept in step by hand:

- Counters and the turn-duration histogram come from the committed events, which the
  service hands to :meth:`Metrics.observe` once each commit is durable (one hook: whatever
  code path emits a turn's end, the counters see it). They count from this daemon's start,
  as Prometheus counters do; a daemon sharing a PostgreSQL store counts what it commits.
- Gauges (agents by state, decisions pending by kind, event-stream subscribers, agents
  frozen by the gateway) are read from the state projection when scraped (a custom
  collector).

The gateway's requests (by outcome) and pool refusals are counted as the daemon answers them
(:meth:`Metrics.gateway_request`), freezes from their ``gateway.agent_frozen`` events.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from corral.daemon import _events as ev
from corral.daemon._state import ENDED_STATES, LIVE_STATES

if TYPE_CHECKING:
    from corral.daemon._databases import Databases
    from corral.daemon._service import AgentService

logger = logging.getLogger("corral.daemon.metrics")

CONTENT_TYPE = CONTENT_TYPE_LATEST
AGENT_STATES = tuple(sorted(LIVE_STATES | ENDED_STATES))
DECISION_KINDS = ("approval", "blocked", "budget_exhausted", "gateway_frozen")
# A turn takes from milliseconds (a command) to an hour (a model working through a task).
TURN_BUCKETS_S = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
_UNKNOWN = "unknown"
_STARTED_MAX = 100_000  # turns in flight remembered for their duration; a bound only


class Metrics:
    """The metrics of one daemon (one app): a :class:`CollectorRegistry` of its own, so
    several daemons in one process (tests, an embedding program) never share a counter.

    ``service`` is read for the gauges and for each event's agent's harness;
    ``databases`` (optional, settable later) for the gateway's frozen agents.
    """

    def __init__(self, service: AgentService, databases: Databases | None = None) -> None:
        self.service = service
        self.databases = databases
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.turns = Counter(
            "corral_turns",
            "Turns ended, by the agent's harness and outcome (completed, failed, interrupted: "
            "cut short by a stop, a stall recovery or preemption without failing).",
            ["harness", "outcome"],
            registry=r,
        )
        self.turn_duration = Histogram(
            "corral_turn_duration_seconds",
            "Time from a turn's start (its slot grant, when it waited for one) to its outcome.",
            ["harness"],
            buckets=TURN_BUCKETS_S,
            registry=r,
        )
        self.tokens = Counter(
            "corral_tokens", "Tokens the agents' turns spent, by harness.", ["harness"], registry=r
        )
        self.cost = Counter(
            "corral_cost_usd",
            "Dollars the agents' turns spent, by harness (turns of unknown cost count 0).",
            ["harness"],
            registry=r,
        )
        self.events = Counter(
            "corral_events", "Events committed to the log, by type.", ["type"], registry=r
        )
        self.gateway_requests = Counter(
            "corral_gateway_requests",
            "Database requests through the gateway, by database and outcome (ok, "
            "genuinely_empty, suspiciously_empty, replayed, or the refusal's code).",
            ["target", "outcome"],
            registry=r,
        )
        self.pool_refusals = Counter(
            "corral_gateway_pool_refusals",
            "Gateway requests refused because the agent's connection pool was exhausted.",
            ["target"],
            registry=r,
        )
        self.freezes = Counter(
            "corral_gateway_freezes",
            "Agents frozen by the gateway (a breaker, or a person), by database.",
            ["target"],
            registry=r,
        )
        r.register(_StateCollector(self))
        self._started: dict[tuple[str, int], datetime] = {}

    @classmethod
    def of(cls, service: AgentService, databases: Databases | None = None) -> Metrics:
        """Metrics told of ``service``'s commits and ``databases``' requests from now on."""
        made = cls(service)
        service.observe_commits(made.observe)
        if databases is not None:
            made.watch(databases)
        return made

    def watch(self, databases: Databases) -> None:
        """Count ``databases``' requests and read their frozen agents from now on."""
        self.databases = databases
        databases.observe_requests(self.gateway_request)

    # --- what happened ------------------------------------------------------------------------

    def observe(self, events: Sequence[ev.Event]) -> None:
        """Count one commit's events (the service calls this once they are durable)."""
        failed = {(e.agent_id, e.data.get("turn")) for e in events if e.type == ev.TURN_FAILED}
        for event in events:
            self.events.labels(event.type).inc()
            kind = event.type
            if kind in (ev.TURN_STARTED, ev.TURN_GRANTED) and event.agent_id is not None:
                self._start(event)
            elif kind == ev.TURN_COMPLETED:
                self._ended(event, "completed")
            elif kind == ev.TURN_FAILED:
                self._ended(event, "failed")
            elif kind == ev.TURN_INTERRUPTED:
                # A turn a restart cut short is settled as failed in the same commit (counted
                # there); a stopped or preempted one ends here.
                counted = (event.agent_id, event.data.get("turn")) in failed
                self._ended(event, None if counted else "interrupted")
            elif kind == ev.GATEWAY_FROZEN:
                self.freezes.labels(str(event.data.get("target", _UNKNOWN))).inc()

    def gateway_request(self, target: str, outcome: str) -> None:
        """One request to database ``target`` answered with ``outcome`` (see
        ``corral.gateway.QueryOutcome.code``)."""
        self.gateway_requests.labels(target, outcome).inc()
        if outcome == "pool_exhausted":
            self.pool_refusals.labels(target).inc()

    def exposition(self) -> bytes:
        """The metrics in Prometheus' text format."""
        return generate_latest(self.registry)

    # --- helpers ------------------------------------------------------------------------------

    def _harness(self, agent_id: str | None) -> str:
        rec = self.service.store.state.agents.get(agent_id or "")
        if rec is None:
            return _UNKNOWN
        harness = rec["spec"].get("harness")
        return harness if isinstance(harness, str) else _UNKNOWN

    def _start(self, event: ev.Event) -> None:
        turn = event.data.get("turn")
        if not isinstance(turn, int) or event.agent_id is None:
            return
        if len(self._started) >= _STARTED_MAX:
            self._started.pop(next(iter(self._started)))
        self._started[(event.agent_id, turn)] = _when(event.ts)

    def _ended(self, event: ev.Event, outcome: str | None) -> None:
        harness = self._harness(event.agent_id)
        usage = event.data.get("usage")
        if isinstance(usage, dict):
            tokens, cost = usage.get("tokens"), usage.get("costUsd")
            if isinstance(tokens, int) and tokens > 0:
                self.tokens.labels(harness).inc(tokens)
            if isinstance(cost, int | float) and cost > 0:
                self.cost.labels(harness).inc(cost)
        if outcome is None:
            return
        self.turns.labels(harness, outcome).inc()
        began = self._started.pop((event.agent_id or "", event.data.get("turn", -1)), None)
        if began is not None:
            took = (_when(event.ts) - began).total_seconds()
            self.turn_duration.labels(harness).observe(max(0.0, took))


def _when(ts: str) -> datetime:
    return datetime.fromisoformat(ts)


class _StateCollector:
    """The gauges, read from the state projection at each scrape."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def describe(self) -> Iterable[Metric]:
        return ()

    def collect(self) -> Iterator[Metric]:
        service = self.metrics.service
        state = service.store.state
        agents = GaugeMetricFamily("corral_agents", "Agents by state.", labels=["state"])
        counts = dict.fromkeys(AGENT_STATES, 0)
        for rec in state.agents.values():
            counts[rec["state"]] = counts.get(rec["state"], 0) + 1
        for name, count in sorted(counts.items()):
            agents.add_metric([name], count)
        yield agents

        pending = dict.fromkeys(DECISION_KINDS, 0)
        for found in state.decisions.values():
            if found["state"] == "pending":
                pending[found["kind"]] = pending.get(found["kind"], 0) + 1
        frozen = GaugeMetricFamily(
            "corral_gateway_frozen_agents", "Agents frozen now, by database.", labels=["target"]
        )
        for target, count in _frozen(self.metrics.databases):
            pending["gateway_frozen"] += count
            frozen.add_metric([target], count)
        decisions = GaugeMetricFamily(
            "corral_decisions_pending", "Decisions waiting on a person, by kind.", labels=["kind"]
        )
        for kind, count in sorted(pending.items()):
            decisions.add_metric([kind], count)
        yield decisions
        yield frozen

        yield GaugeMetricFamily(
            "corral_event_subscribers",
            "Open event streams (GET /events and MCP watchers, server-sent events).",
            value=service.subscriptions,
        )
        running = sum(1 for rec in state.agents.values() if rec["turnInFlight"] is not None)
        yield GaugeMetricFamily("corral_turns_in_flight", "Turns in flight.", value=running)


def _frozen(databases: Databases | None) -> list[tuple[str, int]]:
    if databases is None:
        return []
    found = []
    for target in databases.targets():
        found.append((str(target["name"]), int(target["frozenAgents"])))
    return found
