"""The console's pages and actions: each reads through, or acts through, the API as the
logged-in person sees it (:class:`~corral.daemon._api.ScopedService`), and renders a
template. Nothing here trusts what it shows: the templates escape every value."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from corral.console import _turn
from corral.console._errors import FormInvalidError
from corral.daemon import _listing
from corral.daemon._errors import AgentNotFoundError, InvalidRequestError, TurnNotFoundError
from corral.daemon._state import ENDED_STATES, LIVE_STATES
from corral.kernel import CorralError

if TYPE_CHECKING:
    from corral.console._app import View

Json = dict[str, Any]

FRAGMENT_HEADER: Final = "x-corral-fragment"
"""The live script asks for one part of a page with this header (its ``data-live`` name)."""

HISTORY_SHOWN: Final = 50
AGENTS_SHOWN: Final = 5_000
EVENTS_SHOWN: Final = 200
EVENTS_SCANNED: Final = 5_000
OUTPUT_SHOWN: Final = 20_000
"""Characters of an agent's last output on its (live) page; its turn's page has it all."""
STATES: Final = ("running", "waiting", "idle", "blocked", "paused", "failed", "stopped")

_BUDGET_FIELDS: Final = {"maxTokens": int, "maxCostUsd": float, "maxTurns": int, "deadlineS": float}
_COMMANDS: Final = ("prompt", "stop", "restart")


# --- Waiting on you ---------------------------------------------------------------------------


async def waiting(request: Request, view: View) -> Response:
    api = view.api
    pending = api.decisions()
    history = api.decisions(resolved=True)[:HISTORY_SHOWN]
    return view.render(
        "waiting.html",
        {"decisions": pending, "history": history, "csrf": view.session.csrf},
        {"decisions": "_decisions.html", "history": "_history.html"},
    )


async def answer(request: Request, view: View, form: dict[str, str]) -> Response:
    """``POST /console/decisions/{id}``: the answer the button names, the reason, and what
    goes with it (a retry's new prompt, a budget's new limits)."""
    decision_id = request.path_params["decision_id"]
    given = form.get("answer", "")
    if not given:
        raise FormInvalidError("answer", "say which answer (the decision's buttons)")
    why = form.get("why", "").strip() or None
    text = form.get("text", "").strip() or None
    budget = _budget_of(form) if given == "budget" else None
    await view.api.answer(decision_id, given, why=why, text=text, budget=budget)
    return RedirectResponse(_back(form, "/"), status_code=303)


def _budget_of(form: dict[str, str]) -> Json:
    found: Json = {}
    for name, kind in _BUDGET_FIELDS.items():
        raw = form.get(f"budget.{name}", "").strip()
        if not raw:
            continue
        try:
            value = kind(raw)
        except ValueError:
            raise FormInvalidError(f"budget.{name}", f"not a number: {raw[:40]!r}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise FormInvalidError(f"budget.{name}", f"not a finite number: {raw[:40]!r}")
        found[name] = value
    if not found:
        raise FormInvalidError("budget", "give at least one new limit")
    return found


# --- Agents -----------------------------------------------------------------------------------


async def agents(request: Request, view: View) -> Response:
    api = view.api
    state = request.query_params.get("state") or None
    if state is not None and state not in STATES:
        raise InvalidRequestError(
            [{"field": "state", "message": f"one of {', '.join(STATES)}, got {state[:40]!r}"}]
        )
    search = (request.query_params.get("q") or "").strip()[:200]
    run_filter = _listing.check_filter(
        "run", (request.query_params.get("run") or "").strip() or None
    )
    summaries = _all_agents(view, run=run_filter)
    by_id = {s["id"]: s for s in summaries}
    runs: list[Json] = []
    seen_runs: set[str] = set()
    for summary in summaries:
        run_id = summary["runId"]
        if run_id in seen_runs:
            continue
        seen_runs.add(run_id)
        try:
            tree = api.run(run_id)
        except CorralError:
            continue  # the run's root is out of reach or was deleted meanwhile
        nodes = []
        for node in tree["agents"]:
            found = by_id.get(node["id"])
            if found is None:
                continue
            if state is not None and node["state"] != state:
                continue
            if search and not _matches(search, node):
                continue
            nodes.append({**node, "turns": found.get("turns", 0), "bars": _bars(node)})
        if nodes:
            runs.append({"runId": run_id, "headcount": tree["headcount"], "nodes": nodes})
    return view.render(
        "agents.html",
        {
            "runs": runs,
            "states": STATES,
            "state": state,
            "q": search,
            "run": run_filter or "",
            "total": len(summaries),
            "truncated": len(summaries) >= AGENTS_SHOWN,
        },
        {"tree": "_tree.html"},
    )


def _all_agents(view: View, *, run: str | None = None) -> list[Json]:
    found: list[Json] = []
    cursor = None
    while len(found) < AGENTS_SHOWN:
        page = view.api.list_page(limit=1000, cursor=cursor, run=run)
        found.extend(page["agents"])
        cursor = page.get("nextCursor")
        if cursor is None:
            break
    return found[:AGENTS_SHOWN]


def _matches(search: str, node: Json) -> bool:
    folded = search.casefold()
    return folded in str(node["name"]).casefold() or folded in str(node["id"]).casefold()


def _bars(node: Json) -> list[Json]:
    """Usage of the agent's subtree against each limit in force, for ``<meter>`` bars."""
    usage = node.get("treeUsage") or node.get("usage") or {}
    budget = node.get("budget") or {}
    bars = []
    for label, used_key, limit_key in (
        ("tokens", "tokens", "maxTokens"),
        ("cost $", "costUsd", "maxCostUsd"),
        ("turns", "turns", "maxTurns"),
    ):
        limit = budget.get(limit_key)
        if limit is None:
            continue
        used = usage.get(used_key) or 0
        bars.append({"label": label, "used": used, "limit": limit, "key": limit_key})
    return bars


# --- An agent ---------------------------------------------------------------------------------


async def agent(request: Request, view: View) -> Response:
    api = view.api
    agent_id = api.resolve(request.path_params["agent_id"][:200])
    record = api.get(agent_id)
    agent_id = record["id"]
    session = api.session(agent_id)
    inbox = api.inbox(agent_id)
    turns = await api.service.turn_book.list(agent_id, before=None, limit=50)
    last = api.service.store.state.last_seq
    events = await api.events(max(0, last - EVENTS_SCANNED), agent_id, limit=1000)
    shown = [_event_row(e.to_dict()) for e in events[-100:]][::-1]
    output = record.get("lastOutput") or ""
    return view.render(
        "agent.html",
        {
            "agent": record,
            "spec": json.dumps(record.get("spec") or {}, indent=2, ensure_ascii=False),
            "output": output[:OUTPUT_SHOWN],
            "outputChars": len(output),
            "messages": session.get("messages", []),
            "history": session.get("history"),
            "inbox": inbox,
            "turns": turns,
            "events": shown,
            "live": record["state"] in LIVE_STATES,
            "ended": record["state"] in ENDED_STATES,
            "node": await api.service.node_of(agent_id),
            "csrf": view.session.csrf,
        },
        {"agent": "_agent_live.html"},
    )


async def turn(request: Request, view: View) -> Response:
    api = view.api
    agent_id = api.resolve(request.path_params["agent_id"][:200])
    record = api.get(agent_id)
    n = request.path_params["n"]
    found = await api.service.turn_book.get(record["id"], n) if 1 <= n < 2**31 else None
    if found is None:
        raise TurnNotFoundError(record["id"], n)
    return view.render(
        "turn.html",
        {
            "agent": record,
            "turn": _turn.view(found),
            "n": n,
            "previous": n - 1 if n > 1 else None,
            "next": n + 1 if n < int(record.get("turns") or 0) else None,
            "shown": {"output": _turn.OUTPUT_SHOWN, "lines": _turn.LOG_LINES_SHOWN},
        },
    )


async def command(request: Request, view: View, form: dict[str, str]) -> Response:
    """``POST /console/agents/{id}/prompt|stop|restart``, in the person's name."""
    api = view.api
    name = request.path_params["command"]
    if name not in _COMMANDS:
        raise AgentNotFoundError(request.path_params["agent_id"][:200])
    agent_id = api.resolve(request.path_params["agent_id"][:200])
    why = form.get("why", "").strip() or None
    if name == "prompt":
        text = form.get("text", "").strip() or None
        await api.prompt(agent_id, text, why=why)
    elif name == "stop":
        await api.stop(agent_id, why=why)
    else:
        await api.restart(agent_id, why=why)
    return RedirectResponse(_back(form, f"/console/agents/{quote(agent_id)}"), status_code=303)


# --- Events -----------------------------------------------------------------------------------


async def events(request: Request, view: View) -> Response:
    api = view.api
    params = request.query_params
    raw_types = [t for t in params.getlist("type") if t.strip()]
    types = _listing.event_types(raw_types) if raw_types else None
    run = _listing.check_filter("run", params.get("run") or None)
    agent_id = params.get("agent") or None
    if agent_id is not None:
        agent_id = api.resolve(agent_id[:200])
        api.check_events(agent_id)
    last = api.service.store.state.last_seq
    page = await api.events(max(0, last - EVENTS_SCANNED), agent_id, limit=EVENTS_SCANNED)
    agents_ = api.service.store.state.agents
    rows = [
        _event_row(e.to_dict())
        for e in page
        if _listing.event_matches(agents_, e.type, e.agent_id, types, run)
    ]
    return view.render(
        "events.html",
        {
            "events": rows[-EVENTS_SHOWN:][::-1],
            "type": ",".join(raw_types),
            "agent": agent_id or "",
            "run": run or "",
            "lastSeq": last,
        },
        {"events": "_events.html"},
    )


def _event_row(event: Json) -> Json:
    shown = _listing.redact_event(event)
    data = json.dumps(shown.get("data", {}), ensure_ascii=False, separators=(",", ":"))
    if len(data) > 2000:
        data = data[:2000] + f"... ({len(data)} characters)"
    return {**shown, "summary": data}


# --- Databases --------------------------------------------------------------------------------


async def databases(request: Request, view: View) -> Response:
    api = view.api
    targets = api.targets()
    frozen = [d for d in api.decisions() if d["kind"] == "gateway_frozen"]
    breakers: list[Json] = []
    history: list[Json] = []
    if targets:
        agents_ = [a for a in _all_agents(view)][:200]
        for target in targets:
            for summary in agents_:
                try:
                    status = api.status(target["name"], summary["id"])
                except CorralError:
                    continue
                breakers.append({"agent": summary, **status})
                for item in await api.history(target["name"], summary["id"]):
                    history.append({"agent": summary, **item})
    history.sort(key=lambda h: str(h.get("at") or h.get("frozenAt") or ""), reverse=True)
    return view.render(
        "databases.html",
        {
            "targets": targets,
            "frozen": frozen,
            "breakers": breakers,
            "history": history[:HISTORY_SHOWN],
            "csrf": view.session.csrf,
        },
        {"databases": "_databases_live.html"},
    )


# --- helpers ------------------------------------------------------------------------------


def _back(form: dict[str, str], default: str) -> str:
    """Where an action returns to: the console page it was sent from, else ``default``."""
    from corral.console._app import _next_of

    given = form.get("next")
    return _next_of(given) if given else default


def pretty_json(value: Any) -> str:
    """A value as indented JSON, for a ``<pre>`` (escaped by the template like any text)."""
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def when(value: Any) -> str:
    """A timestamp as people read it (UTC, to the second); anything else as text."""
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            return value
        return parsed.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return "" if value is None else str(value)
