"""From a state change to the console's DOM showing it, measured in the browser.

Goal (issue 14): a page left open all day shows what waits on a person as it happens.
Run with ``.venv/bin/python -m bench bench_console`` (the system's Chromium: ``apt-get
install chromium``; without it the bench says so and measures nothing).

A real ``corral serve`` runs in a subprocess on loopback; headless Chromium (driven by
Playwright through ``executable_path``) logs in to its console and keeps "Waiting on you"
open. Each sample happens inside the page, in the browser's own clock (``performance.now()``):
the page arms a ``MutationObserver``, notes the time, and asks the daemon's HTTP API for an
approval (``POST /agents/{id}/actions`` with an action a rule sends to a person, the
daemon's token, ``waitS`` 0); the observer notes the time at which the approval's card,
found by its unique action, is in the DOM. Between those two: the decision recorded, its
event on the console's stream, the page fetching its live part again and merging it in. The
API's own answer (202, the decision's id) is timed alongside, for scale. The bench then
denies the approval through the API and waits for the card to leave the page before the
next sample, so each one starts from a quiet page.
"""

from __future__ import annotations

import os
import secrets
import statistics
import tempfile
from pathlib import Path
from typing import Any

import httpx

from bench.bench_oversight import start_server

WARMUP = 5
SAMPLES = 200
STEP_TIMEOUT_MS = 10_000  # any one wait in the page; a bound only
RULE = {"match": "deploy", "verdict": "ask", "reason": "deploys need a person"}

# Runs in the page: arm the observer, then ask for the approval; resolves with the times.
SAMPLE_JS = """
async ([agentId, action, token, timeoutMs]) => {
  const shows = () => Array.from(document.querySelectorAll('[data-testid$="-action"]'))
    .some((el) => el.textContent === action);
  let observer;
  const shown = new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("not shown: " + action)), timeoutMs);
    observer = new MutationObserver(() => {
      if (shows()) { clearTimeout(timer); resolve(performance.now()); }
    });
    observer.observe(document.body, { childList: true, subtree: true, characterData: true });
  });
  const start = performance.now();
  const answer = await fetch("/agents/" + agentId + "/actions", {
    method: "POST",
    headers: { "Authorization": "Bearer " + token, "Content-Type": "application/json" },
    body: JSON.stringify({ action: action, waitS: 0 }),
  });
  const answered = performance.now();
  const body = await answer.json();
  const at = await shown;
  observer.disconnect();
  return { status: answer.status, decision: body.decision, answeredMs: answered - start,
           shownMs: at - start };
}
"""


def percentile(values: list[float], p: float) -> float:
    """The ``p``-th percentile (nearest rank) of ``values``."""
    ranked = sorted(values)
    k = max(0, min(len(ranked) - 1, round(p / 100 * len(ranked) + 0.5) - 1))
    return ranked[k]


def chromium() -> str | None:
    named = os.environ.get("CORRAL_CHROMIUM") or "/usr/bin/chromium"
    return named if Path(named).is_file() and os.access(named, os.X_OK) else None


def measure(url: str, token: str, agent_id: str, browser_path: str) -> list[dict[str, Any]]:
    from playwright.sync_api import expect, sync_playwright

    samples: list[dict[str, Any]] = []
    with (
        sync_playwright() as playwright,
        httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as api,
    ):
        browser = playwright.chromium.launch(executable_path=browser_path, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.set_default_timeout(STEP_TIMEOUT_MS)
            page.goto(f"{url}/console/login")
            page.get_by_test_id("login-token").fill(token)
            page.get_by_test_id("login-submit").click()
            expect(page.get_by_test_id("live-status")).to_have_text("live", timeout=STEP_TIMEOUT_MS)
            for i in range(WARMUP + SAMPLES):
                action = f"deploy build-{i:04d} to prod"
                got = page.evaluate(SAMPLE_JS, [agent_id, action, token, STEP_TIMEOUT_MS])
                if got["status"] != 202:
                    raise RuntimeError(f"the approval was not pending: {got}")
                denied = api.post(
                    f"/decisions/{got['decision']}", json={"answer": "deny", "why": "bench"}
                )
                denied.raise_for_status()
                page.get_by_test_id(f"decision-{got['decision']}").wait_for(state="detached")
                if i >= WARMUP:
                    samples.append(got)
        finally:
            browser.close()
    return samples


def main() -> None:
    browser_path = chromium()
    if browser_path is None:
        print("skipped: no Chromium at /usr/bin/chromium (CORRAL_CHROMIUM); apt-get install it")
        return
    token = secrets.token_urlsafe(24)
    with tempfile.TemporaryDirectory() as tmp:
        process, url = start_server(Path(tmp), token)
        try:
            with httpx.Client(
                base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30
            ) as api:
                made = api.post(
                    "/agents",
                    json={"name": "asker", "harness": "command", "command": ["true"]}
                    | {"guardrails": [RULE]},
                )
                made.raise_for_status()
                agent_id = made.json()["id"]
            samples = measure(url, token, agent_id, browser_path)
        finally:
            process.terminate()
            process.wait(30)
    shown = [s["shownMs"] for s in samples]
    answered = [s["answeredMs"] for s in samples]
    print(f"{len(samples)} approvals, one at a time, each from request to card in the DOM\n")
    print("| from the request (browser clock) | p50 | p99 | min | max |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for label, values in (
        ("the approval's card in the DOM", shown),
        ("the API's 202 (for scale)", answered),
    ):
        print(
            f"| {label} | {statistics.median(values):.1f} ms | "
            f"{percentile(values, 99):.1f} ms | {min(values):.1f} ms | {max(values):.1f} ms |"
        )
