"""The console in process, against the real app, service and SQLite store: login and its
refusals, sessions (logout, revocation), CSRF and origin refusals that change nothing,
answers recorded in the person's name, and hostile text escaped on every page."""

from __future__ import annotations

import re
from typing import Any

from corral.console import Console
from corral.daemon._auth import OPERATOR
from tests.console.conftest import Site
from tests.support.front_door import DAEMON_TOKEN
from tests.support.harness import fail

ASKS = [{"match": "deploy", "verdict": "ask", "reason": "deploys need a person", "timeoutS": 600}]
HOSTILE_NAME = "<script>alert(1)<script>"  # names hold no '/' (they go in paths)
HOSTILE_OUTPUT = '"><img src=x onerror=alert(2)></pre></script><script>alert(3)</script>'


async def pending_approval(site: Site, action: str = "deploy web") -> tuple[str, str]:
    """An idle agent that asked to act: its id and the approval's id."""
    agent = await site.door.spawn(name="releaser", guardrails=ASKS)
    verdict = await site.door.service.check_action(agent, action, {"ticket": 7})
    assert verdict.verdict == "pending"
    assert verdict.decision is not None
    return agent, verdict.decision


def answer_form(csrf: str | None, answer: str = "approve", why: str = "release checked") -> Any:
    form = {"answer": answer, "why": why, "next": "/"}
    if csrf is not None:
        form["csrf"] = csrf
    return form


# --- login ------------------------------------------------------------------------------------


async def test_the_daemons_token_logs_in_and_the_cookie_is_httponly_and_strict(site: Site) -> None:
    async with site.browser() as browser:
        answer = await browser.post("/console/login", data={"token": DAEMON_TOKEN, "next": "/"})
        assert answer.status_code == 303
        assert answer.headers["location"] == "/"
        cookie = answer.headers["set-cookie"].lower()
        assert "httponly" in cookie
        assert "samesite=strict" in cookie
        assert DAEMON_TOKEN.lower() not in cookie  # an opaque id, never the token
        home = await browser.get("/")
        assert home.status_code == 200
        assert 'data-testid="whoami">operator<' in home.text


async def test_a_named_operator_token_logs_in_under_its_name(site: Site) -> None:
    made = await site.door.service.create_token("alice", by=OPERATOR)
    async with site.browser() as browser:
        await site.login(browser, made["token"])
        assert 'data-testid="whoami">alice<' in (await browser.get("/")).text


async def test_an_agents_token_is_refused_at_login_with_a_clear_message(site: Site) -> None:
    agent = await site.door.spawn(name="worker")
    async with site.browser() as browser:
        answer = await browser.post(
            "/console/login", data={"token": site.door.agent_token(agent), "next": "/"}
        )
        assert answer.status_code == 401
        assert 'data-code="login_refused"' in answer.text
        assert "an agent&#39;s token cannot open the console" in answer.text
        assert "set-cookie" not in answer.headers
        assert (await browser.get("/")).status_code == 303


async def test_a_wrong_token_is_refused(site: Site) -> None:
    async with site.browser() as browser:
        for token in ("nope", "", "x" * 5000, "corral-agent.a_1.deadbeef"):
            answer = await browser.post("/console/login", data={"token": token})
            assert answer.status_code == 401, token
            assert 'data-code="login_refused"' in answer.text
        assert (await browser.get("/")).status_code == 303


async def test_every_page_needs_a_session_and_comes_back_after_login(site: Site) -> None:
    async with site.browser() as browser:
        for path in ("/", "/console/agents", "/console/events", "/console/databases"):
            answer = await browser.get(path)
            assert answer.status_code == 303, path
            assert answer.headers["location"].startswith("/console/login?next=")
        answer = await browser.post(
            "/console/login", data={"token": DAEMON_TOKEN, "next": "/console/events"}
        )
        assert answer.headers["location"] == "/console/events"
        # The live stream and fragments answer 401 without a session (the script reloads).
    async with site.browser() as stranger:
        assert (await stranger.get("/console/stream")).status_code == 401
        fragment = await stranger.get("/", headers={"X-Corral-Fragment": "decisions"})
        assert fragment.status_code == 401


async def test_login_never_redirects_off_the_console(site: Site) -> None:
    async with site.browser() as browser:
        for target in ("//evil.example/", "https://evil.example/", "/agents", "/\\evil", "x"):
            answer = await browser.post(
                "/console/login", data={"token": DAEMON_TOKEN, "next": target}
            )
            assert answer.headers["location"] == "/", target


async def test_logout_ends_the_session(site: Site) -> None:
    async with site.browser() as browser:
        csrf = await site.login(browser)
        answer = await browser.post("/console/logout", data={"csrf": csrf})
        assert answer.status_code == 303
        assert len(site.console.sessions) == 0
        assert (await browser.get("/")).status_code == 303


async def test_a_revoked_token_ends_its_sessions(site: Site) -> None:
    service = site.door.service
    made = await service.create_token("bob", by=OPERATOR)
    async with site.browser() as browser:
        await site.login(browser, made["token"])
        assert (await browser.get("/console/agents")).status_code == 200
        await service.revoke_token("bob", by=OPERATOR)
        answer = await browser.get("/console/agents")
        assert answer.status_code == 303
        assert answer.headers["location"].startswith("/console/login")
        # And the same token cannot open a new one.
        again = await browser.post("/console/login", data={"token": made["token"]})
        assert again.status_code == 401


async def test_the_api_behind_the_console_keeps_its_own_gate(site: Site) -> None:
    async with site.browser() as browser:
        assert (await browser.get("/agents")).status_code == 401
        assert (await browser.get("/healthz")).status_code == 200
        bearer = {"authorization": f"Bearer {DAEMON_TOKEN}"}
        assert (await browser.get("/agents", headers=bearer)).status_code == 200
    # A session cookie is no bearer token: the API refuses it.
    async with site.browser() as browser:
        await site.login(browser)
        assert (await browser.get("/decisions")).status_code == 401


async def test_answers_carry_the_security_headers(site: Site) -> None:
    async with site.browser() as browser:
        for path in ("/console/login", "/console/static/console.js", "/console/nothing"):
            answer = await browser.get(path)
            csp = answer.headers["content-security-policy"]
            assert "script-src 'self'" in csp
            assert "frame-ancestors 'none'" in csp
            assert answer.headers["x-frame-options"] == "DENY"
        assert (await browser.get("/console/static/..%2Fconsole.css")).status_code == 404
        assert (await browser.get("/console/static/_app.py")).status_code == 404


async def test_refused_methods_carry_the_security_headers_too(site: Site) -> None:
    # Starlette answers a method a route does not take (405) before any console handler.
    async with site.browser() as browser:
        for method, path in (("POST", "/"), ("PUT", "/console/login"), ("DELETE", "/")):
            answer = await browser.request(method, path)
            assert answer.status_code in (404, 405), (method, path)
            assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]
            assert answer.headers["x-content-type-options"] == "nosniff"
            assert answer.headers["cache-control"] == "no-store"


def test_the_console_needs_an_app_with_a_token(site: Site) -> None:
    import pytest

    from corral.kernel import InvalidArgumentError

    with pytest.raises(InvalidArgumentError):
        Console(site.door.app(token=None))


# --- answering, and forgery refused -----------------------------------------------------------


async def test_answering_an_approval_records_the_persons_name_and_why(site: Site) -> None:
    _, decision = await pending_approval(site)
    made = await site.door.service.create_token("alice", by=OPERATOR)
    async with site.browser() as browser:
        csrf = await site.login(browser, made["token"])
        page = (await browser.get("/")).text
        assert f'data-testid="decision-{decision}"' in page
        assert f'data-testid="decision-{decision}-answer-approve"' in page
        answer = await browser.post(f"/console/decisions/{decision}", data=answer_form(csrf))
        assert answer.status_code == 303, answer.text
        found = site.door.service.decision(decision)
        assert found["state"] == "resolved"
        assert (found["answer"], found["by"], found["why"]) == (
            "approve",
            "alice",
            "release checked",
        )
        page = (await browser.get("/")).text
        assert f'data-testid="decision-{decision}"' not in page
        assert re.search(
            rf'data-testid="history-{decision}" data-answer="approve" data-by="alice"', page
        )
        # Answered already: a typed refusal, on a page.
        again = await browser.post(f"/console/decisions/{decision}", data=answer_form(csrf))
        assert again.status_code == 409
        assert 'data-testid="error-code">decision_answered<' in again.text


async def test_a_post_without_or_with_a_wrong_form_token_changes_nothing(site: Site) -> None:
    _, decision = await pending_approval(site)
    async with site.browser() as browser:
        csrf = await site.login(browser)
        for form, code in (
            (answer_form(None), "csrf_refused"),
            (answer_form("wrong" + csrf), "csrf_refused"),
        ):
            answer = await browser.post(f"/console/decisions/{decision}", data=form)
            assert answer.status_code == 403
            assert f'data-testid="error-code">{code}<' in answer.text
        foreign = await browser.post(
            f"/console/decisions/{decision}",
            data=answer_form(csrf),
            headers={"origin": "http://evil.example"},
        )
        assert foreign.status_code == 403
        assert 'data-testid="error-code">forbidden_origin<' in foreign.text
        # Another port of the same host is another origin, though the same site for cookies.
        other_port = await browser.post(
            f"/console/decisions/{decision}",
            data=answer_form(csrf),
            headers={"origin": "http://127.0.0.1:8080"},
        )
        assert other_port.status_code == 403
        cross_site = await browser.post(
            f"/console/decisions/{decision}",
            data=answer_form(csrf),
            headers={"sec-fetch-site": "cross-site"},
        )
        assert cross_site.status_code == 403
    async with site.browser() as stranger:
        answer = await stranger.post(f"/console/decisions/{decision}", data=answer_form(csrf))
        assert answer.status_code == 401
    assert site.door.service.decision(decision)["state"] == "pending"


async def test_bad_forms_are_refused_with_typed_errors(site: Site) -> None:
    _, decision = await pending_approval(site)
    async with site.browser() as browser:
        csrf = await site.login(browser)
        too_big = await browser.post(
            f"/console/decisions/{decision}", data={**answer_form(csrf), "why": "x" * 70_000}
        )
        assert too_big.status_code == 400
        assert "form_invalid" in too_big.text
        nul = await browser.post(
            f"/console/decisions/{decision}", data={**answer_form(csrf), "why": "a\x00b"}
        )
        assert nul.status_code == 400
        wrong = await browser.post(
            f"/console/decisions/{decision}", data=answer_form(csrf, answer="retry")
        )
        assert wrong.status_code == 400
        assert "answer_not_accepted" in wrong.text
        unknown = await browser.post("/console/decisions/d_nothing", data=answer_form(csrf))
        assert unknown.status_code == 404
        json_body = await browser.post(f"/console/decisions/{decision}", json=answer_form(csrf))
        assert json_body.status_code == 400
    assert site.door.service.decision(decision)["state"] == "pending"


async def test_a_held_agent_is_retried_and_stopped_from_the_console(site: Site) -> None:
    door = site.door
    door.harness.script("flaky", fail("disk full"))
    agent = await door.spawn(name="flaky", prompt="go", onFailure="ask")
    await door.settled(agent, "blocked")
    async with site.browser() as browser:
        csrf = await site.login(browser)
        page = (await browser.get("/")).text
        decision = site.door.service.get(agent)["decision"]
        assert f'data-testid="decision-{decision}-answer-retry"' in page
        assert "disk full" in page
        door.harness.script("flaky", "fixed")
        answer = await browser.post(
            f"/console/decisions/{decision}", data=answer_form(csrf, "retry", "space freed")
        )
        assert answer.status_code == 303, answer.text
        await door.settled(agent, "idle")
        stop = await browser.post(
            f"/console/agents/{agent}/stop", data={"csrf": csrf, "why": "done for today"}
        )
        assert stop.status_code == 303, stop.text
        await door.until(agent, "stopped")
        page = (await browser.get(f"/console/agents/{agent}")).text
        assert 'data-testid="agent-state" data-state="stopped"' in page


# --- hostile text -----------------------------------------------------------------------------


async def test_hostile_names_and_outputs_are_escaped_on_every_page(site: Site) -> None:
    door = site.door
    door.harness.script(HOSTILE_NAME, HOSTILE_OUTPUT)
    agent = await door.spawn(name=HOSTILE_NAME, prompt=HOSTILE_OUTPUT, guardrails=ASKS)
    await door.settled(agent, "idle")
    await door.service.check_action(agent, f"deploy {HOSTILE_OUTPUT}", {"x": HOSTILE_NAME})
    async with site.browser() as browser:
        await site.login(browser)
        for path in (
            "/",
            "/console/agents",
            f"/console/agents/{agent}",
            f"/console/agents/{agent}/turns/1",
            "/console/events",
            "/console/databases",
            f"/console/agents?q={HOSTILE_NAME}",
        ):
            answer = await browser.get(path)
            assert answer.status_code == 200, (path, answer.text)
            assert "<script>alert" not in answer.text, path
            assert "<img" not in answer.text, path
        home = (await browser.get("/")).text
        assert "&lt;script&gt;alert(1)&lt;script&gt;" in home
        assert "&#34;&gt;&lt;img src=x onerror=alert(2)&gt;" in home


async def test_fragments_are_the_live_parts_of_a_page(site: Site) -> None:
    await pending_approval(site)
    async with site.browser() as browser:
        await site.login(browser)
        answer = await browser.get("/", headers={"X-Corral-Fragment": "decisions"})
        assert answer.status_code == 200
        assert answer.text.lstrip().startswith('<section class="decisions" data-live="decisions"')
        assert "<html" not in answer.text


async def test_the_agents_page_shows_trees_and_filters(site: Site) -> None:
    door = site.door
    lead = await door.spawn(name="lead", budget={"maxTurns": 10})
    child = await door.spawn(name="helper", parent=lead)
    async with site.browser() as browser:
        await site.login(browser)
        page = (await browser.get("/console/agents")).text
        assert f'data-testid="agent-{lead}" data-state="idle" data-parent="" data-depth="0"' in page
        assert f'data-testid="agent-{child}" data-state="idle" data-parent="{lead}"' in page
        assert f'data-testid="agent-{lead}-bar-maxTurns"' in page
        only = (await browser.get("/console/agents?q=help")).text
        assert f'data-testid="agent-{child}"' in only
        assert f'data-testid="agent-{lead}"' not in only
        none = (await browser.get("/console/agents?state=blocked")).text
        assert 'data-testid="agents-empty"' in none
        bad = await browser.get("/console/agents?state=<x>")
        assert bad.status_code == 400


async def test_the_live_stream_ends_with_its_session_even_when_nothing_happens(
    site: Site,
) -> None:
    import asyncio

    import pytest
    from starlette.requests import Request

    from corral.console import _stream
    from corral.daemon._auth import Caller
    from tests.support.front_door import BOUND_S

    console = Console(site.door.app(), heartbeat_s=0.05)
    session = console.sessions.open(DAEMON_TOKEN, Caller(OPERATOR))
    cookie = f"corral_console_4600={session.id}".encode()
    request = Request(
        {
            "type": "http",
            "method": "GET",
            "path": "/console/stream",
            "query_string": b"",
            "headers": [(b"cookie", cookie)],
            "server": ("127.0.0.1", 4600),
        }
    )
    last = site.door.service.store.state.last_seq
    changes = _stream._changes(console, request, session, last)
    await anext(changes)  # hello
    console.sessions.close(session.id)  # logged out in another tab; no event comes after
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(changes), BOUND_S)


async def test_login_needs_a_browsers_word_that_it_comes_from_the_console(site: Site) -> None:
    # Login CSRF: the login form carries no session's form token (there is no session yet),
    # so the browser's Origin or Sec-Fetch-Site must say the POST comes from this origin.
    form = {"token": DAEMON_TOKEN, "next": "/"}
    async with site.browser() as browser:
        bare = await browser.post("/console/login", data=form, headers={"origin": ""})
        assert bare.status_code == 403
        assert 'data-testid="error-code">forbidden_origin<' in bare.text
        assert "set-cookie" not in bare.headers
        for headers in ({"sec-fetch-site": "same-site"}, {"origin": "null"}):
            refused = await browser.post("/console/login", data=form, headers=headers)
            assert refused.status_code == 403, headers
            assert "set-cookie" not in refused.headers
    for headers in ({"sec-fetch-site": "same-origin"}, {"origin": "http://127.0.0.1:4600"}):
        async with site.browser() as browser:
            answer = await browser.post("/console/login", data=form, headers=headers)
            assert answer.status_code == 303, headers
            assert "set-cookie" in answer.headers


async def test_an_agents_megabyte_output_is_clipped_on_its_live_page(site: Site) -> None:
    # The agent's live part is fetched again at every event of the daemon, by every tab.
    door = site.door
    door.harness.script("talker", "x" * 1_000_000)
    agent = await door.spawn(name="talker", prompt="say a lot")
    await door.settled(agent, "idle")
    async with site.browser() as browser:
        await site.login(browser)
        live = await browser.get(f"/console/agents/{agent}", headers={"x-corral-fragment": "agent"})
        assert live.status_code == 200
        assert len(live.text) < 200_000, len(live.text)
        assert "1000000 characters" in live.text  # says how much there is, and where
        assert f"/console/agents/{agent}/turns/1" in live.text
