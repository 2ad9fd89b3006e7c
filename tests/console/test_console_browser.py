"""The console in a real browser: headless Chromium against a real ``corral serve`` with a
shop database, a person's named token and agents that ask, fail and get frozen.

A person logs in with their token; a held agent and an approval appear on the page they
already have open (no reload); they approve with a reason, the agent goes on and the
decision moves to the history under their name; they reinstate an agent the gateway froze;
an agent's token cannot log in; a forged cross-site POST changes nothing. Each page is
saved as a screenshot on the way (tests/support/console.py says where).

One daemon serves the whole module (it takes seconds to start); each test makes agents of
its own, so the tests hold in any order. Every wait is bounded.
"""

from __future__ import annotations

import html
import json
import shlex
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, ViewportSize, expect

from tests.support.browser import STEP_TIMEOUT_MS, VIEWPORT
from tests.support.console import login, other_origin, screenshot_dir, shoot, wait_live
from tests.support.serve_process import CLI, ServeProcess, until_state, wait_for

# A daemon and a browser start in the first test of the module: seconds each.
pytestmark = pytest.mark.timeout(90)

PERSON = "alice"
CHECK = shlex.join([*CLI, "check"])
# A shell worker that asks before it acts (`corral check` waits for the person's answer).
ASKING_WORKER = f'{CHECK} "$ACTION" || exit 3; echo "done: $ACTION"'
ASK_DEPLOY = {"match": "deploy", "verdict": "ask", "reason": "deploys need a person"}


@dataclass
class Served:
    """The daemon, a client with its own token, and the person's named token."""

    daemon: ServeProcess
    api: httpx.Client
    person_token: str
    shots: Path

    @property
    def url(self) -> str:
        return self.daemon.url

    def spawn(self, **spec: Any) -> str:
        spec.setdefault("harness", "command")
        answer = self.api.post("/agents", json=spec)
        assert answer.status_code == 201, answer.text
        return str(answer.json()["id"])

    def asking_worker(self, name: str, action: str) -> str:
        return self.spawn(
            name=name,
            command=["sh", "-c", ASKING_WORKER],
            env={"ACTION": action},
            prompt="go",
            guardrails=[ASK_DEPLOY],
        )

    def open_decision(self, agent_id: str) -> dict[str, Any]:
        """The decision ``agent_id`` waits on, once it has one."""

        def found() -> dict[str, Any] | None:
            answer = self.api.get("/decisions")
            assert answer.status_code == 200, answer.text
            mine = [d for d in answer.json()["decisions"] if d["agentId"] == agent_id]
            return mine[0] if mine else None

        decision: dict[str, Any] = wait_for(found, f"a decision of {agent_id}")
        return decision

    def decision(self, decision_id: str) -> dict[str, Any]:
        answer = self.api.get(f"/decisions/{decision_id}")
        assert answer.status_code == 200, answer.text
        found: dict[str, Any] = answer.json()
        return found


def make_shop(path: Path) -> Path:
    conn = sqlite3.connect(path)
    try:
        conn.executescript(
            """
            CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL,
                                 total NUMERIC NOT NULL);
            INSERT INTO orders VALUES (1, 'open', 25), (2, 'paid', 40), (3, 'shipped', 12);
            """
        )
        conn.commit()
    finally:
        conn.close()
    return path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    where = tmp_path_factory.mktemp("console")
    shop = make_shop(where / "shop.db")
    with ServeProcess(where, "--db", f"shop=sqlite:///{shop}") as daemon, daemon.client() as api:
        made = api.post("/tokens", json={"name": PERSON})
        assert made.status_code == 201, made.text
        yield Served(daemon, api, made.json()["token"], screenshot_dir(where / "screenshots"))


@pytest.fixture
def person(served: Served, page: Page) -> Page:
    """The page of the person, logged in with their own token, on "Waiting on you"."""
    login(page, served.url, served.person_token)
    expect(page.get_by_test_id("whoami")).to_have_text(PERSON)
    return page


def test_the_system_chromium_loads_a_real_daemons_health_page(served: Served, page: Page) -> None:
    answer = page.goto(f"{served.url}/healthz")
    assert answer is not None
    assert answer.status == 200
    assert json.loads(page.inner_text("body"))["status"] == "ok"
    assert page.viewport_size == {"width": 1280, "height": 800}
    assert "HeadlessChrome" in page.evaluate("navigator.userAgent")


# --- what waits on you, live -------------------------------------------------------------------


def test_a_held_agent_and_an_approval_appear_live_and_the_answer_goes_to_history(
    served: Served, person: Page
) -> None:
    page = person
    wait_live(page)
    page.evaluate("window.loadedOnce = true")  # gone if the page were loaded again

    held = served.spawn(
        name="deployer",
        command=["sh", "-c", "echo 'migration 42 failed: lock timeout' >&2; exit 1"],
        prompt="migrate",
        onFailure="ask",
    )
    worker = served.asking_worker("releaser", "deploy web to prod")
    hold = served.open_decision(held)
    approval = served.open_decision(worker)
    assert (hold["kind"], approval["kind"]) == ("blocked", "approval")

    card = page.get_by_test_id(f"decision-{approval['id']}")
    expect(card).to_be_visible()
    expect(card).to_have_attribute("data-kind", "approval")
    expect(page.get_by_test_id(f"decision-{approval['id']}-action")).to_have_text(
        "deploy web to prod"
    )
    held_card = page.get_by_test_id(f"decision-{hold['id']}")
    expect(held_card).to_be_visible()
    expect(held_card).to_contain_text("migration 42 failed: lock timeout")
    assert page.evaluate("window.loadedOnce") is True  # it came live, not by a reload
    shoot(page, served.shots, "waiting")

    page.get_by_test_id(f"decision-{approval['id']}-why").fill("change ticket 1234 checked")
    page.get_by_test_id(f"decision-{approval['id']}-answer-approve").click()

    row = page.get_by_test_id(f"history-{approval['id']}")
    expect(row).to_be_visible()
    expect(page.get_by_test_id(f"history-{approval['id']}-answer")).to_have_text("approve")
    expect(page.get_by_test_id(f"history-{approval['id']}-by")).to_have_text(PERSON)
    expect(page.get_by_test_id(f"history-{approval['id']}-why")).to_have_text(
        "change ticket 1234 checked"
    )
    expect(card).to_have_count(0)
    expect(held_card).to_be_visible()  # the other decision still waits

    done = until_state(served.api, worker, "idle", "failed")
    assert done["state"] == "idle", done["lastError"]
    assert done["lastOutput"] == "done: deploy web to prod\n"
    answered = served.decision(approval["id"])
    assert (answered["answer"], answered["by"], answered["why"]) == (
        "approve",
        PERSON,
        "change ticket 1234 checked",
    )

    page.goto(f"{served.url}/console/agents/{worker}")
    expect(page.get_by_test_id("agent-state")).to_have_text("idle")
    expect(page.get_by_test_id("turn-1")).to_contain_text("succeeded")
    expect(page.get_by_test_id("agent-output")).to_have_text("done: deploy web to prod")
    shoot(page, served.shots, "agent")


# --- databases ---------------------------------------------------------------------------------


def test_a_person_reinstates_an_agent_the_gateway_froze(served: Served, person: Page) -> None:
    page = person
    auditor = served.spawn(name="auditor", command=["true"])  # no prompt: idle
    with served.daemon.client(served.daemon.agent_token(auditor)) as own:

        def frozen() -> bool:
            answer = own.post(
                "/gateway/query", json={"target": "shop", "sql": "SELECT colour FROM orders"}
            )
            assert answer.status_code in (400, 423), answer.text
            return answer.status_code == 423

        wait_for(frozen, "the gateway to freeze the auditor")
    freeze = served.open_decision(auditor)
    assert freeze["kind"] == "gateway_frozen"

    page.get_by_test_id("nav-databases").click()
    expect(page.get_by_test_id("page-databases")).to_be_visible()
    expect(page.get_by_test_id("db-target-shop")).to_be_visible()
    evidence = page.get_by_test_id(f"frozen-{auditor}-evidence")
    expect(evidence).to_contain_text("unknown_column")
    shoot(page, served.shots, "databases")

    page.get_by_test_id(f"reinstate-{auditor}-why").fill("it asked for a column we dropped")
    page.get_by_test_id(f"reinstate-{auditor}").click()
    expect(page.get_by_test_id(f"frozen-{auditor}")).to_have_count(0)

    status = served.api.get(f"/gateway/shop/agents/{auditor}")
    assert status.status_code == 200, status.text
    assert status.json()["frozen"] is False
    answered = served.decision(freeze["id"])
    assert (answered["answer"], answered["by"], answered["why"]) == (
        "reinstate",
        PERSON,
        "it asked for a column we dropped",
    )
    page.goto(f"{served.url}/")
    expect(page.get_by_test_id(f"history-{freeze['id']}-by")).to_have_text(PERSON)


# --- who may log in ----------------------------------------------------------------------------


def test_an_agents_token_cannot_log_in(served: Served, page: Page) -> None:
    agent = served.spawn(name="helper", command=["true"])
    page.goto(f"{served.url}/")
    expect(page.get_by_test_id("page-login")).to_be_visible()  # sent to log in first
    shoot(page, served.shots, "login")

    page.get_by_test_id("login-token").fill(served.daemon.agent_token(agent))
    with page.expect_response(lambda r: r.url.endswith("/console/login")) as posted:
        page.get_by_test_id("login-submit").click()
    assert posted.value.status == 401
    refusal = page.get_by_test_id("login-refusal")
    expect(refusal).to_have_attribute("data-code", "login_refused")
    expect(refusal).to_contain_text("an agent's token cannot open the console")
    assert not [c for c in page.context.cookies() if c["name"].startswith("corral_console")]

    page.goto(f"{served.url}/console/agents")
    expect(page.get_by_test_id("page-login")).to_be_visible()


def test_the_agents_and_events_pages_show_the_team(served: Served, person: Page) -> None:
    page = person
    lead = served.spawn(name="lead", command=["true"])
    indexer = served.spawn(
        name="indexer",
        command=["sh", "-c", "echo indexed 42 files; echo disk almost full >&2"],
        prompt="index",
        parent=lead,
    )
    served.spawn(name="fetcher", command=["true"], parent=lead)
    until_state(served.api, indexer, "idle")

    page.get_by_test_id("nav-agents").click()
    expect(page.get_by_test_id("page-agents")).to_be_visible()
    expect(page.get_by_test_id(f"agent-{indexer}-state")).to_have_text("idle")
    expect(page.locator(f"[data-parent='{lead}']")).to_have_count(2)
    shoot(page, served.shots, "agents")

    page.get_by_test_id("nav-events").click()
    expect(page.get_by_test_id("page-events")).to_be_visible()
    page.get_by_test_id("events-filter-type").fill("agent.state_changed,agent.turn_completed")
    page.get_by_test_id("events-filter-submit").click()
    events = page.get_by_test_id("events")
    expect(events).to_contain_text("indexed 42 files")
    expect(events).not_to_contain_text("agent.created")
    shoot(page, served.shots, "events")

    # An agent's turn, its log line by line (stderr stands apart), then its run's tree.
    page.goto(f"{served.url}/console/agents/{indexer}/turns/1")
    expect(page.get_by_test_id("turn-outcome")).to_have_text("succeeded")
    log = page.get_by_test_id("turn-log")
    out = log.locator("li[data-stream=stdout]", has_text="indexed 42 files")
    err = log.locator("li[data-stream=stderr]", has_text="disk almost full")
    background = "e => getComputedStyle(e).backgroundColor"
    assert out.evaluate(background) != err.evaluate(background)
    page.get_by_test_id("turn-back").click()
    page.get_by_test_id("agent-run").click()
    expect(page.get_by_test_id(f"agent-{indexer}")).to_be_visible()
    expect(page.get_by_test_id("agents-filter-run")).not_to_have_value("")


# --- forged requests ---------------------------------------------------------------------------


def test_a_forged_cross_site_post_is_refused_and_changes_nothing(
    served: Served, person: Page
) -> None:
    page = person
    worker = served.asking_worker("guarded", "deploy api to prod")
    approval = served.open_decision(worker)
    target = f"{served.url}/console/decisions/{approval['id']}"

    # A page on another port of the same host, visited by the logged-in person, posts a
    # form to the console: the browser sends the session cookie (same site), not the form
    # token, and says where the request comes from.
    forged = f"""<!doctype html><title>win a prize</title>
<form id="f" method="post" action="{html.escape(target)}">
<input name="answer" value="approve"><input name="why" value="forged"></form>
<script>document.getElementById("f").submit()</script>"""
    with (
        other_origin(forged) as elsewhere,
        page.expect_response(lambda r: r.url == target) as posted,
    ):
        page.goto(elsewhere)
    assert posted.value.status == 403
    expect(page.get_by_test_id("error-code")).to_have_text("forbidden_origin")

    # With the session's own form token but from a foreign origin: refused all the same.
    page.goto(f"{served.url}/")
    csrf = page.locator("meta[name=corral-csrf]").get_attribute("content")
    assert csrf
    form: dict[str, str | float | bool] = {"answer": "approve", "why": "forged", "csrf": csrf}
    foreign = page.request.post(target, form=form, headers={"Origin": "http://127.0.0.1:1"})
    assert foreign.status == 403, foreign.text()
    assert "forbidden_origin" in foreign.text()
    # From no origin at all, but without the form token: refused.
    tokenless = page.request.post(target, form={"answer": "approve", "why": "forged"})
    assert tokenless.status == 403, tokenless.text()
    assert "csrf_refused" in tokenless.text()

    still = served.decision(approval["id"])
    assert still["state"] == "pending", still
    assert served.api.get(f"/agents/{worker}").json()["state"] == "waiting"

    # The same answer from the console's own page goes through: the refusals above were
    # the forgery's, not the form's.
    page.get_by_test_id(f"decision-{approval['id']}-why").fill("by hand")
    page.get_by_test_id(f"decision-{approval['id']}-answer-deny").click()
    expect(page.get_by_test_id(f"history-{approval['id']}-by")).to_have_text(PERSON)
    assert served.decision(approval["id"])["answer"] == "deny"


# --- many tabs ---------------------------------------------------------------------------------


def test_many_tabs_of_one_person_stay_live_on_one_stream(served: Served, browser: Browser) -> None:
    # A browser opens at most 6 connections to one host over HTTP/1.1: were each tab to hold
    # a stream of its own, a 7th tab of the console would not even load.
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(STEP_TIMEOUT_MS)
    try:
        tabs = [context.new_page()]
        login(tabs[0], served.url, served.person_token)
        wait_live(tabs[0])
        for _ in range(7):
            tab = context.new_page()
            tab.goto(f"{served.url}/console/events")
            wait_live(tab)
            tabs.append(tab)
        agent = served.spawn(name="many-tabs", command=["true"])
        for tab in tabs[1:]:
            expect(tab.get_by_test_id("events")).to_contain_text(agent)
        # The tab holding the stream closes: another takes it up, and all stay live.
        tabs.pop(0).close()
        other = served.spawn(name="many-tabs-2", command=["true"])
        for tab in tabs:
            expect(tab.get_by_test_id("events")).to_contain_text(other)
    finally:
        context.close()


# --- a phone's width, and the keyboard --------------------------------------------------------

PHONE: ViewportSize = {"width": 390, "height": 844}
OVERFLOW = "document.documentElement.scrollWidth - document.documentElement.clientWidth"


def tab_to(page: Page, test_id: str, most: int = 80) -> None:
    """Press Tab until the element ``test_id`` has the focus (at most ``most`` times)."""
    for _ in range(most):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement?.dataset?.testid") == test_id:
            return
    raise AssertionError(f"{test_id} not reached with {most} presses of Tab")


def test_every_page_fits_a_phone_and_an_approval_is_answered_with_the_keyboard(
    served: Served, browser: Browser
) -> None:
    worker = served.asking_worker("pocket", "deploy " + "d" * 300)  # no place to break
    approval = served.open_decision(worker)
    until_state(served.api, worker, "waiting")
    context = browser.new_context(viewport=PHONE, is_mobile=True, has_touch=True)
    context.set_default_timeout(STEP_TIMEOUT_MS)
    try:
        page = context.new_page()
        page.goto(f"{served.url}/console/login")
        assert page.evaluate(OVERFLOW) <= 0, "login"
        login(page, served.url, served.person_token)
        for path in (
            "/",
            "/console/agents",
            f"/console/agents/{worker}",
            f"/console/agents/{worker}/turns/1",
            "/console/events",
            "/console/databases",
        ):
            page.goto(f"{served.url}{path}")
            expect(page.get_by_test_id("whoami")).to_have_text(PERSON)
            assert page.evaluate(OVERFLOW) <= 0, f"{path} is wider than a phone"

        page.goto(f"{served.url}/")
        expect(page.get_by_test_id(f"decision-{approval['id']}")).to_be_visible()
        tab_to(page, f"decision-{approval['id']}-why")
        page.keyboard.type("checked on my phone")
        tab_to(page, f"decision-{approval['id']}-answer-approve")
        page.keyboard.press("Enter")
        expect(page.get_by_test_id(f"history-{approval['id']}-by")).to_have_text(PERSON)
        expect(page.get_by_test_id(f"history-{approval['id']}-why")).to_have_text(
            "checked on my phone"
        )
        assert served.decision(approval["id"])["answer"] == "approve"
    finally:
        context.close()
