"""A turn's page (its record as facts, its output, its log as lines marked by stream; hostile
text escaped and control characters made visible; bounded), the agent page's turns, and the
agents page filtered by run."""

from __future__ import annotations

import re
from typing import Any

import pytest

from corral.console import _turn
from corral.daemon import TurnRequest, TurnResult
from corral.daemon._text import visible
from tests.console.conftest import Site
from tests.support.harness import fail

ANSI = "\x1b[31mred\x1b[0m"
HOSTILE = f"<script>alert(1)</script> {ANSI} \u202eevil\u202c"


def log_lines(site: Site, monkeypatch: pytest.MonkeyPatch, *lines: tuple[str, str]) -> None:
    """Every turn of the door's harness first writes ``lines`` (stream, text) to its log."""
    original = site.door.harness.run_turn

    async def run_turn(request: TurnRequest) -> TurnResult:
        assert request.log is not None
        for stream, text in lines:
            request.log.write(stream, text)
        return await original(request)

    monkeypatch.setattr(site.door.harness, "run_turn", run_turn)


def log_items(page: str) -> list[tuple[str, str]]:
    """The log's lines on a turn's page: (class, inner HTML of the text)."""
    return re.findall(
        r'<li class="([^"]+)" data-stream="[^"]+"><span class="stream">[^<]+</span>'
        r"<code>(.*?)</code></li>",
        page,
    )


async def test_a_turns_page_shows_its_record_output_and_log_readably(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    door = site.door
    log_lines(site, monkeypatch, ("stdout", "plain line\n"), ("stderr", f"{HOSTILE}\n"))
    door.harness.script("worker", TurnResult(output=f"{HOSTILE}\nsecond line", tokens=42))
    agent = await door.spawn(name="worker", prompt=f"do {HOSTILE}")
    await door.settled(agent, "idle")
    await door.api.prompt(agent, "again")
    await door.settled(agent, "idle")
    async with site.browser() as browser:
        await site.login(browser)
        first = await browser.get(f"/console/agents/{agent}/turns/1")
        assert first.status_code == 200
        page = first.text
    # Nothing hostile acts: no markup, no control character, no bidi override.
    assert "<script>alert" not in page
    assert "\x1b" not in page
    assert "\u202e" not in page
    escaped = r"&lt;script&gt;alert(1)&lt;/script&gt; \x1b[31mred\x1b[0m \u202eevil\u202c"
    # The record as facts.
    record = page[page.index('data-testid="turn-record"') : page.index("</dl>")]
    for fact in ("outcome", "started", "ended", "duration", "usage", "prompt"):
        assert f"<dt>{fact}</dt>" in record, fact
    assert 'data-testid="turn-outcome" data-outcome="succeeded">succeeded<' in record
    assert "42 tokens" in record
    assert f'data-testid="turn-prompt">do {escaped}</pre>' in record
    # The output in a <pre>, its newlines kept.
    assert f'<pre class="output" data-testid="turn-output">{escaped}\nsecond line</pre>' in page
    # The log as lines, each marked with its stream.
    assert log_items(page) == [("stream-stdout", "plain line"), ("stream-stderr", escaped)]
    assert 'data-testid="turn-dropped"' not in page
    # Back to the agent, on to the next turn (none before the first).
    assert f'href="/console/agents/{agent}" data-testid="turn-back"' in page
    assert f'href="/console/agents/{agent}/turns/2" rel="next"' in page
    assert 'data-testid="turn-previous"' not in page
    async with site.browser() as browser:
        await site.login(browser)
        last = (await browser.get(f"/console/agents/{agent}/turns/2")).text
    assert f'href="/console/agents/{agent}/turns/1" rel="prev"' in last
    assert 'data-testid="turn-next"' not in last


async def test_a_failed_turns_page_shows_its_error_and_usage(site: Site) -> None:
    door = site.door
    door.harness.script("breaker", fail(f"broke: {HOSTILE}", tokens=7))
    agent = await door.spawn(name="breaker", prompt="go")
    await door.settled(agent, "failed")
    async with site.browser() as browser:
        await site.login(browser)
        page = (await browser.get(f"/console/agents/{agent}/turns/1")).text
        agent_page = (await browser.get(f"/console/agents/{agent}")).text
    assert 'data-outcome="failed"' in page
    assert '<pre class="error" data-testid="turn-error">broke: &lt;script&gt;' in page
    assert r"\x1b[31m" in page
    assert "\x1b" not in page
    assert "7 tokens" in page
    assert 'data-testid="turn-output-none">No output.<' in page
    assert 'data-testid="turn-log-empty"' in page
    # The agent's page lists the turn with its outcome, linked to its page.
    item = re.search(r'<li data-testid="turn-1">(.*?)</li>', agent_page)
    assert item is not None
    assert f'href="/console/agents/{agent}/turns/1"' in item.group(1)
    assert 'data-testid="turn-1-outcome">failed<' in item.group(1)
    assert r"\x1b[31m" in item.group(1)  # its error, as on every console page: made visible
    assert "\x1b" not in agent_page


async def test_a_capped_log_shows_what_was_dropped(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    door = site.door
    monkeypatch.setattr(door.service.turn_book, "cap", 2048)
    log_lines(
        site, monkeypatch, ("stdout", "".join(f"line {i:04d} {'x' * 40}\n" for i in range(200)))
    )
    agent = await door.spawn(name="chatty", prompt="talk")
    await door.settled(agent, "idle")
    async with site.browser() as browser:
        await site.login(browser)
        page = (await browser.get(f"/console/agents/{agent}/turns/1")).text
    assert 'data-testid="turn-dropped"' in page
    items = log_items(page)
    assert items[0] == ("stream-stdout", f"line 0000 {'x' * 40}")
    assert items[-1][0] == "stream-corral dropped"
    assert "capped at 2048 bytes: dropped" in items[-1][1]


async def test_what_a_turns_page_renders_is_bounded(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    door = site.door
    monkeypatch.setattr(_turn, "LOG_LINES_SHOWN", 10)
    monkeypatch.setattr(_turn, "OUTPUT_SHOWN", 1000)
    log_lines(site, monkeypatch, ("log", "".join(f"entry {i}\n" for i in range(50))))
    door.harness.script("big", "y" * 5000)
    agent = await door.spawn(name="big", prompt="go")
    await door.settled(agent, "idle")
    async with site.browser() as browser:
        await site.login(browser)
        page = (await browser.get(f"/console/agents/{agent}/turns/1")).text
    assert [text for _, text in log_items(page)] == [f"entry {i}" for i in range(10)]
    assert 'data-testid="turn-log-clipped">the first 10 of 50 lines' in page
    assert f"corral logs {agent} --turn 1" in page
    assert "y" * 1000 + "</pre>" in page
    assert "y" * 1001 not in page
    assert 'data-testid="turn-output-clipped">the first 1000 of 5000 characters' in page


async def test_a_turn_that_is_not_there_is_refused(site: Site) -> None:
    agent = await site.door.spawn(name="quiet")
    async with site.browser() as browser:
        await site.login(browser)
        for n in (1, 0, 2**40):
            answer = await browser.get(f"/console/agents/{agent}/turns/{n}")
            assert answer.status_code == 404, n
            assert 'data-testid="error-code">turn_not_found<' in answer.text


def test_visible_keeps_lines_for_a_pre_and_escapes_every_other_control() -> None:
    text = "a\tb\nc\rd\x1b[1m\x07\u2028\u202e\x9b"
    assert visible(text) == r"a\tb\nc\rd\x1b[1m\x07\u2028\u202e\x9b"
    assert visible(text, lines=True) == "a\tb\n" + r"c\rd\x1b[1m\x07\u2028\u202e\x9b"


@pytest.mark.parametrize(
    ("started", "ended", "shown"),
    [
        ("2026-01-01T00:00:00+00:00", "2026-01-01T00:00:01.25+00:00", "1.2 s"),
        ("2026-01-01T00:00:00+00:00", "2026-01-01T00:02:05+00:00", "2 min 5 s"),
        ("2026-01-01T00:00:00+00:00", "2026-01-01T03:04:00+00:00", "3 h 4 min"),
        ("2026-01-01T00:00:01+00:00", "2026-01-01T00:00:00+00:00", None),
        ("2026-01-01T00:00:00+00:00", None, None),
        ("not a time", "2026-01-01T00:00:00+00:00", None),
    ],
)
def test_a_turns_duration(started: Any, ended: Any, shown: str | None) -> None:
    assert _turn.duration(started, ended) == shown


# --- the agents page by run ------------------------------------------------------------------


async def test_the_agents_page_filters_by_run_with_state_and_name(site: Site) -> None:
    door = site.door
    lead = await door.spawn(name="lead")
    helper = await door.spawn(name="helper", parent=lead)
    other = await door.spawn(name="other-helper")
    run = door.service.get(lead)["runId"]
    assert door.service.get(helper)["runId"] == run != door.service.get(other)["runId"]
    async with site.browser() as browser:
        await site.login(browser)
        agent_page = (await browser.get(f"/console/agents/{helper}")).text
        assert f'href="/console/agents?run={run}" data-testid="agent-run"' in agent_page
        page = (await browser.get(f"/console/agents?run={run}")).text
        assert f'data-testid="agent-{lead}"' in page
        assert f'data-testid="agent-{helper}"' in page
        assert f'data-testid="agent-{other}"' not in page
        assert f'value="{run}" maxlength="200" data-testid="agents-filter-run"' in page
        both = (await browser.get(f"/console/agents?run={run}&q=helper&state=idle")).text
        assert f'data-testid="agent-{helper}"' in both
        assert f'data-testid="agent-{lead}"' not in both
        assert f'data-testid="agent-{other}"' not in both
        everywhere = (await browser.get("/console/agents?q=helper")).text
        assert f'data-testid="agent-{other}"' in everywhere
        none = (await browser.get("/console/agents?run=no-such-run")).text
        assert 'data-testid="agents-empty">No agents match.<' in none
        too_long = await browser.get("/console/agents?run=" + "r" * 201)
        assert too_long.status_code == 422  # as the API refuses it (invalid_query)
        assert 'data-testid="error-code">invalid_query<' in too_long.text
