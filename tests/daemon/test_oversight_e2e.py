"""Oversight through real ``corral serve`` processes: agents that ask before they act (a shell
worker's ``corral check``, the ``openai`` harness's tool calls), people answering from the
decisions inbox, rules of the daemon and of the spec, the tokens agents are given, and a
pending approval across ``kill -9``.

One daemon (with a daemon-wide rules file) serves most tests: a daemon takes seconds to
start, and each test works with agents of its own. Every wait polls with a bound.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.front_door import serve_env
from tests.support.openai_server import OpenAIServer, completion, tool_call
from tests.support.serve_process import (
    CLI,
    START_BOUND_S,
    WAIT_BOUND_S,
    ServeProcess,
    wait_for,
)
from tests.support.serve_process import agent_record as agent
from tests.support.serve_process import until_state as until

CHECK = shlex.join([*CLI, "check"])
# A shell worker that asks before it acts: the action comes from its spec's env, and what
# `corral check` answered (exit status, reason) ends up in the turn's stderr tail.
WORKER = (
    f'{CHECK} "$ACTION"; rc=$?; echo "check exited $rc" >&2; '
    '[ "$rc" -eq 0 ] || exit 3; echo "done: $ACTION"'
)
TOOL_WORKER = str(Path(__file__).with_name("workers") / "tool_worker.py")
ORG_RULES = [
    {"match": "drop database", "verdict": "block", "reason": "the organisation keeps its data"}
]
ASK_DEPLOY = {"match": "deploy", "verdict": "ask", "reason": "deploys need a person"}

# A test that starts the shared daemon waits for it to import and listen: seconds.
pytestmark = pytest.mark.timeout(60)


# --- helpers -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """The shared ``corral serve``, with the organisation's rules file."""
    where = tmp_path_factory.mktemp("serve")
    rules = where / "rules.json"
    rules.write_text(json.dumps({"guardrails": ORG_RULES}))
    with ServeProcess(where, "--guardrails", str(rules)) as served:
        yield served


@pytest.fixture
def api(daemon: ServeProcess) -> Iterator[httpx.Client]:
    """A client with the daemon's own token (the operator's)."""
    with daemon.client() as client:
        yield client


def spawn(api: httpx.Client, **spec: Any) -> str:
    spec.setdefault("harness", "command")
    answer = api.post("/agents", json=spec)
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def worker(api: httpx.Client, action: str, *rules: dict[str, Any], **spec: Any) -> str:
    """A shell worker that checks ``action`` in its first turn, with its own ``rules``."""
    script = spec.pop("script", WORKER)
    return spawn(
        api,
        name=spec.pop("name", "worker"),
        command=["sh", "-c", script],
        env={"ACTION": action},
        prompt="go",
        guardrails=list(rules),
        **spec,
    )


def decisions(api: httpx.Client, agent_id: str, *, resolved: bool = False) -> list[dict[str, Any]]:
    params = {"resolved": "true"} if resolved else {}
    answer = api.get("/decisions", params=params)
    assert answer.status_code == 200, answer.text
    return [d for d in answer.json()["decisions"] if d["agentId"] == agent_id]


def waiting_on(api: httpx.Client, agent_id: str) -> dict[str, Any]:
    """The pending approval ``agent_id`` waits on, once it waits (``waiting``, naming it)."""
    rec = until(api, agent_id, "waiting", "idle", "failed", "blocked")
    assert rec["state"] == "waiting", rec["lastError"]
    (found,) = decisions(api, agent_id)
    assert rec["decision"] == found["id"]
    return found


def decision(api: httpx.Client, decision_id: str) -> dict[str, Any]:
    answer = api.get(f"/decisions/{decision_id}")
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()
    return found


def refused(answer: httpx.Response, status: int, code: str) -> str:
    """The refusal's message, after checking its status and code."""
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["code"] == code, error
    return str(error["message"])


def when(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp)


def agent_env(daemon: ServeProcess, agent_id: str) -> dict[str, str]:
    """The environment the command line has inside an agent: URL, token and id."""
    env = {k: v for k, v in os.environ.items() if k not in ("CORRAL_TOKEN", "CORRAL_HOME")}
    return env | {
        "CORRAL_URL": daemon.url,
        "CORRAL_TOKEN": daemon.agent_token(agent_id),
        "CORRAL_AGENT_ID": agent_id,
    }


def cli_as_agent(
    daemon: ServeProcess, agent_id: str, *args: str
) -> subprocess.CompletedProcess[str]:
    """The command line run as the agent runs it."""
    return subprocess.run(
        [*CLI, *args],
        env=agent_env(daemon, agent_id),
        capture_output=True,
        text=True,
        timeout=WAIT_BOUND_S,
    )


# --- a shell worker asks, a person answers -----------------------------------------------------


def test_a_shell_worker_waits_for_approval_and_finishes(api: httpx.Client) -> None:
    rule = {**ASK_DEPLOY, "timeoutS": 600, "onTimeout": "deny"}
    worker_id = worker(api, "deploy web to prod", rule)
    asked = waiting_on(api, worker_id)
    assert asked["kind"] == "approval"
    assert asked["action"] == "deploy web to prod"
    assert asked["reason"] == "deploys need a person"
    assert asked["answers"] == ["approve", "deny"]
    assert asked["onTimeout"] == "deny"
    left = when(asked["deadline"]) - datetime.now(UTC)
    assert timedelta(seconds=500) < left <= timedelta(seconds=600)

    answer = api.post(f"/decisions/{asked['id']}", json={"answer": "approve", "why": "checked"})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"decision": asked["id"], "answer": "approve", "agentId": worker_id}

    done = until(api, worker_id, "idle", "failed")
    assert done["state"] == "idle", done["lastError"]
    assert done["lastOutput"] == "done: deploy web to prod\n"
    answered = decision(api, asked["id"])
    assert (answered["state"], answered["answer"]) == ("resolved", "approve")
    assert (answered["by"], answered["why"], answered["timedOut"]) == ("operator", "checked", False)
    assert [d["id"] for d in decisions(api, worker_id, resolved=True)] == [asked["id"]]
    again = api.post(f"/decisions/{asked['id']}", json={"answer": "deny"})
    assert "'approve' by operator" in refused(again, 409, "decision_answered")


def test_a_denied_worker_fails_its_turn_saying_who_denied_it_and_why(api: httpx.Client) -> None:
    worker_id = worker(api, "deploy web to prod", ASK_DEPLOY)
    asked = waiting_on(api, worker_id)
    answer = api.post(f"/decisions/{asked['id']}", json={"answer": "deny", "why": "not on Friday"})
    assert answer.status_code == 200, answer.text

    failed = until(api, worker_id, "failed", "idle")
    assert failed["state"] == "failed"  # onFailure defaults to fail
    error = failed["lastError"]
    assert "exited with code 3" in error
    assert "check exited 1" in error
    assert "blocked: denied by operator: not on Friday" in error
    assert failed["lastOutput"] is None
    answered = decision(api, asked["id"])
    assert (answered["answer"], answered["by"], answered["why"]) == (
        "deny",
        "operator",
        "not on Friday",
    )


def test_a_deadline_answers_as_on_timeout_says(api: httpx.Client) -> None:
    deny = worker(api, "deploy web", {**ASK_DEPLOY, "timeoutS": 1}, name="deny")
    allow = worker(api, "deploy api", {**ASK_DEPLOY, "timeoutS": 1, "onTimeout": "allow"})

    denied = until(api, deny, "failed", "idle")
    assert denied["state"] == "failed"
    assert "check exited 1" in denied["lastError"]
    assert "nobody answered approval" in denied["lastError"]
    allowed = until(api, allow, "idle", "failed")
    assert allowed["state"] == "idle", allowed["lastError"]
    assert allowed["lastOutput"] == "done: deploy api\n"
    for agent_id, expected in ((deny, "deny"), (allow, "approve")):
        (answered,) = decisions(api, agent_id, resolved=True)
        assert (answered["answer"], answered["by"], answered["timedOut"]) == (
            expected,
            "corral",
            True,
        )
        assert answered["why"].startswith("nobody answered within 1 s")
        assert decisions(api, agent_id) == []


def test_a_block_rule_refuses_at_once_and_opens_no_decision(
    daemon: ServeProcess, api: httpx.Client
) -> None:
    idle = spawn(
        api,
        name="schema",
        command=["true"],
        guardrails=[
            {"match": "drop table", "verdict": "block", "reason": "no schema changes"},
            ASK_DEPLOY,
        ],
    )
    blocked = cli_as_agent(daemon, idle, "check", "drop table users")
    assert blocked.returncode == 1, blocked.stderr
    assert blocked.stderr.strip() == "blocked: no schema changes"
    assert decisions(api, idle) == []
    assert decisions(api, idle, resolved=True) == []


# --- the daemon's own rules --------------------------------------------------------------------


def test_daemon_rules_come_before_an_agents_own_allow(
    daemon: ServeProcess, api: httpx.Client
) -> None:
    allow_all = {"match": "drop database", "verdict": "allow"}
    worker_id = worker(api, "drop database prod", allow_all)
    failed = until(api, worker_id, "failed", "idle")
    assert failed["state"] == "failed"
    assert "check exited 1" in failed["lastError"]
    assert "blocked: the organisation keeps its data" in failed["lastError"]
    assert decisions(api, worker_id, resolved=True) == []
    # The same through HTTP, asked with an agent's own token.
    idle = spawn(api, name="dba", command=["true"], guardrails=[allow_all])
    with daemon.client(daemon.agent_token(idle)) as own:
        answer = own.post(f"/agents/{idle}/actions", json={"action": "DROP DATABASE x"})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {
        "verdict": "blocked",
        "reason": "the organisation keeps its data",
        "warnings": [],
        "decision": None,
    }


def test_a_bad_rules_file_stops_corral_serve(tmp_path: Path) -> None:
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps([{"match": "deploy", "verdict": "maybe"}]))
    served = ServeProcess(tmp_path, "--guardrails", str(rules))
    done = subprocess.run(
        served.command, capture_output=True, text=True, timeout=START_BOUND_S, env=serve_env()
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert "error invalid_guardrails_file" in done.stderr
    assert str(rules) in done.stderr
    assert "verdict" in done.stderr
    assert "Traceback" not in done.stderr


# --- the openai harness's tool calls -----------------------------------------------------------


def openai_agent(api: httpx.Client, server: OpenAIServer, rule: dict[str, Any]) -> str:
    tool = {"name": "deploy", "command": [sys.executable, TOOL_WORKER, "touch"]}
    return spawn(
        api,
        name="model",
        harness="openai",
        openai={"baseUrl": server.base_url, "model": "test-model", "tools": [tool]},
        guardrails=[rule],
        prompt="ship it",
    )


def tool_answers(server: OpenAIServer) -> list[str]:
    """What the second model request told the model about its tool call."""
    messages = server.requests[1].json["messages"]
    return [m["content"] for m in messages if m["role"] == "tool"]


def test_a_blocked_tool_call_never_runs_and_the_model_is_told(
    api: httpx.Client, openai_server: OpenAIServer
) -> None:
    openai_server.enqueue(
        completion(tool_calls=[tool_call("deploy", {"path": "deployed"})]),
        completion("I may not deploy"),
    )
    rule = {"match": "deploy", "verdict": "block", "reason": "no deploys today"}
    model = openai_agent(api, openai_server, rule)
    done = until(api, model, "idle", "failed")
    assert done["state"] == "idle", done["lastError"]
    assert done["lastOutput"] == "I may not deploy"
    assert not (Path(done["workdir"]) / "deployed").exists()
    assert tool_answers(openai_server) == ["tool 'deploy' refused: no deploys today"]
    assert decisions(api, model, resolved=True) == []


def test_a_tool_call_that_asks_waits_for_a_person_then_runs(
    api: httpx.Client, openai_server: OpenAIServer
) -> None:
    openai_server.enqueue(
        completion(tool_calls=[tool_call("deploy", {"path": "deployed"})]),
        completion("deployed it"),
    )
    model = openai_agent(api, openai_server, {**ASK_DEPLOY, "timeoutS": 600})
    asked = waiting_on(api, model)
    assert asked["action"] == 'deploy {"path": "deployed"}'
    workdir = Path(agent(api, model)["workdir"])
    assert not (workdir / "deployed").exists()
    assert len(openai_server.requests) == 1  # the run waits with the person

    answer = api.post(f"/decisions/{asked['id']}", json={"answer": "approve", "why": "go"})
    assert answer.status_code == 200, answer.text
    done = until(api, model, "idle", "failed")
    assert done["state"] == "idle", done["lastError"]
    assert done["lastOutput"] == "deployed it"
    assert (workdir / "deployed").read_text() == "made by the tool\n"
    assert tool_answers(openai_server) == ["made deployed\n"]


# --- what an agent's own token may not do ------------------------------------------------------


PRINT_TOKEN = f'printf %s "$CORRAL_TOKEN" > agent-token; {WORKER}'


def test_an_agents_token_is_refused_beyond_its_reach(
    daemon: ServeProcess, api: httpx.Client
) -> None:
    idle = {"command": ["true"]}
    lead = spawn(api, name="lead", mayAnswer=["approval"], **idle)
    other = spawn(api, name="other", **idle)
    child = worker(
        api,
        "deploy web",
        ASK_DEPLOY,
        name="child",
        parent=lead,
        script=PRINT_TOKEN,
        budget={"maxTurns": 5},
    )
    orphan = worker(api, "deploy api", ASK_DEPLOY, name="orphan", parent=other)
    asked = waiting_on(api, child)
    orphan_asked = waiting_on(api, orphan)

    # The token the child was given is its own, derived from the daemon's.
    own = (Path(agent(api, child)["workdir"]) / "agent-token").read_text()
    assert own == daemon.agent_token(child)
    assert own != daemon.token
    with daemon.client(own) as child_api:
        approve = {"answer": "approve", "why": "I say so"}
        refused(child_api.post(f"/decisions/{asked['id']}", json=approve), 403, "out_of_scope")
        raise_budget = {"budget": {"maxTurns": 50}, "by": child, "why": "more"}
        refused(child_api.patch(f"/agents/{child}", json=raise_budget), 403, "out_of_scope")
        reinstate = {"reason": "let me back in"}
        answer = child_api.post(f"/gateway/main/agents/{child}/reinstate", json=reinstate)
        refused(answer, 403, "out_of_scope")
        query = {"agent": lead, "sql": "select 1"}
        refused(child_api.post("/gateway/query", json=query), 403, "out_of_scope")
    # A parent whose spec does not list approvals in mayAnswer may not answer its child's.
    with daemon.client(daemon.agent_token(other)) as other_api:
        answer = other_api.post(f"/decisions/{orphan_asked['id']}", json=approve)
        assert "mayAnswer" in refused(answer, 403, "out_of_scope")
    assert decision(api, asked["id"])["state"] == "pending"
    in_force = agent(api, child)
    assert in_force.get("budget", in_force["spec"]["budget"])["maxTurns"] == 5

    # One that does may, and the record names it.
    with daemon.client(daemon.agent_token(lead)) as lead_api:
        answer = lead_api.post(f"/decisions/{asked['id']}", json={"answer": "approve", "why": "ok"})
    assert answer.status_code == 200, answer.text
    answered = decision(api, asked["id"])
    assert (answered["answer"], answered["by"], answered["why"]) == ("approve", lead, "ok")
    assert until(api, child, "idle", "failed")["lastOutput"] == "done: deploy web\n"
    assert api.post(f"/decisions/{orphan_asked['id']}", json={"answer": "deny"}).status_code == 200
    until(api, orphan, "failed")


def test_a_request_without_a_token_is_refused_on_loopback(daemon: ServeProcess) -> None:
    assert daemon.url.startswith("http://127.0.0.1:")
    with daemon.client(None) as anonymous:
        assert anonymous.get("/healthz").status_code == 200
        refused(anonymous.get("/agents"), 401, "unauthorized")
        refused(
            anonymous.post("/decisions/d_000000000000", json={"answer": "approve"}),
            401,
            "unauthorized",
        )
    with daemon.client("not-the-token") as wrong:
        refused(wrong.get("/agents"), 401, "unauthorized")


# --- a pending approval across kill -9 ---------------------------------------------------------


@dataclass
class Restarted:
    """A daemon killed while approvals waited and started again past their deadlines."""

    daemon: ServeProcess
    deny: str  # a shell worker waiting in `corral check`, onTimeout deny
    allow: str  # the same, onTimeout allow
    idle: str  # an idle agent that asked over HTTP
    asker: str  # an idle agent whose `corral check` (run by the test) waited
    check: subprocess.Popen[bytes]  # that `corral check`
    check_stderr: Path
    decisions: dict[str, str]  # agent id -> its approval's id


@pytest.fixture(scope="module")
def restarted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Restarted]:
    """Two shell workers wait in ``corral check`` and an idle agent's approval is pending
    when the daemon is killed; it starts again (on the same port, which the workers call)
    once every deadline has passed. Meanwhile a ``corral check`` of a third agent, run by
    the test, waits too."""
    where = tmp_path_factory.mktemp("restart")
    served = ServeProcess(where).start()
    check: subprocess.Popen[bytes] | None = None
    try:
        rule = {**ASK_DEPLOY, "timeoutS": 4}
        with served.client() as api:
            deny = worker(api, "deploy web", rule, name="deny")
            allow = worker(api, "deploy api", {**rule, "onTimeout": "allow"}, name="allow")
            idle = spawn(api, name="idle", command=["true"], guardrails=[rule])
            asker = spawn(api, name="asker", command=["true"], guardrails=[rule])
            stderr = where / "check.err"
            with stderr.open("wb") as err:
                check = subprocess.Popen(
                    [*CLI, "check", "deploy docs"],
                    env=agent_env(served, asker),
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                )
            asked = {deny: waiting_on(api, deny), allow: waiting_on(api, allow)}
            (asked[asker],) = wait_for(lambda: decisions(api, asker), "the check's approval")
        with served.client(served.agent_token(idle)) as own:
            answer = own.post(f"/agents/{idle}/actions", json={"action": "deploy db"})
            assert answer.status_code == 202, answer.text
            assert answer.json()["verdict"] == "pending"
        with served.client() as api:
            (asked[idle],) = decisions(api, idle)
            assert all(
                d["state"] == "pending" for d in decisions(api, deny) + decisions(api, allow)
            )
        served.kill_9()
        last = max(when(d["deadline"]) for d in asked.values())
        first = min(when(d["deadline"]) for d in asked.values())
        assert datetime.now(UTC) < first, "too slow: a deadline passed before the kill"
        wait_for(lambda: datetime.now(UTC) > last, "the deadlines to pass with no daemon")
        served.start()
        ids = {k: v["id"] for k, v in asked.items()}
        yield Restarted(served, deny, allow, idle, asker, check, stderr, ids)
    finally:
        if check is not None and check.poll() is None:
            check.kill()
            check.wait(WAIT_BOUND_S)
        if served.proc is not None and served.proc.poll() is not None:
            # Killed and not started again: a start ends the turns left behind (their
            # `corral check` would otherwise retry for good), and the stop below the rest.
            with contextlib.suppress(AssertionError):
                served.start()
        served.stop()


@pytest.mark.timeout(90)
def test_a_deadline_passed_while_the_daemon_was_down_is_applied_at_start(
    restarted: Restarted,
) -> None:
    daemon, idle = restarted.daemon, restarted.idle
    with daemon.client() as api:
        # At start, not later: the first answer of the new daemon says so already.
        found = decision(api, restarted.decisions[idle])
        assert found["state"] == "resolved"
        assert (found["answer"], found["by"], found["timedOut"]) == ("deny", "corral", True)
        assert agent(api, idle)["state"] == "idle"
    with daemon.client(daemon.agent_token(idle)) as own:
        verdict = own.get(f"/actions/{restarted.decisions[idle]}", params={"waitS": 0})
    assert verdict.status_code == 200, verdict.text
    assert verdict.json()["verdict"] == "blocked"
    assert verdict.json()["reason"].startswith("nobody answered approval")


@pytest.mark.timeout(90)
def test_a_check_cut_short_by_a_kill_9_gets_the_verdict_of_the_same_approval(
    restarted: Restarted,
) -> None:
    returncode = restarted.check.wait(WAIT_BOUND_S)
    said = restarted.check_stderr.read_text()
    assert returncode == 1, said
    approval = restarted.decisions[restarted.asker]
    assert said.startswith(f"blocked: nobody answered approval {approval} before its deadline")
    with restarted.daemon.client() as api:
        assert decisions(api, restarted.asker) == []  # it was not asked again
        (answered,) = decisions(api, restarted.asker, resolved=True)
    assert (answered["id"], answered["answer"], answered["timedOut"]) == (approval, "deny", True)


@pytest.mark.timeout(90)
def test_a_worker_waiting_in_corral_check_gets_its_verdict_after_a_kill_9(
    restarted: Restarted,
) -> None:
    with restarted.daemon.client() as api:
        for agent_id, answer in ((restarted.deny, "deny"), (restarted.allow, "approve")):
            found = decision(api, restarted.decisions[agent_id])
            assert (found["answer"], found["by"], found["timedOut"]) == (answer, "corral", True)
        denied = until(api, restarted.deny, "failed", "idle")
        assert denied["state"] == "failed"
        assert "exited with code 3" in denied["lastError"]
        assert "nobody answered approval" in denied["lastError"]
        allowed = until(api, restarted.allow, "idle", "failed")
        assert allowed["state"] == "idle", allowed["lastError"]
        assert allowed["lastOutput"] == "done: deploy api\n"
        # Each worker had its verdict from the approval it waited on: nobody was asked again.
        for agent_id in (restarted.deny, restarted.allow):
            assert decisions(api, agent_id) == []
            answered = decisions(api, agent_id, resolved=True)
            assert [d["id"] for d in answered] == [restarted.decisions[agent_id]]
