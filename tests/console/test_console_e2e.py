"""The console of a real ``corral serve``: log in over HTTP with the daemon's token, see an
agent's approval on "Waiting on you", answer it, and find the answer recorded in the
operator's name; the live stream opens for the session."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.console.conftest import CSRF
from tests.support.serve_process import WAIT_BOUND_S, ServeProcess

ASKS = [{"match": "deploy", "verdict": "ask", "reason": "deploys need a person", "timeoutS": 600}]


@pytest.mark.timeout(60)
def test_log_in_and_answer_an_approval_on_a_real_daemon(tmp_path: Path) -> None:
    with ServeProcess(tmp_path) as daemon, daemon.client() as api:
        spec = {"name": "releaser", "harness": "command", "command": ["cat"], "guardrails": ASKS}
        agent = api.post("/agents", json=spec).json()["id"]
        with daemon.client(daemon.agent_token(agent)) as own:
            asked = own.post(f"/agents/{agent}/actions", json={"action": "deploy web"})
        assert asked.status_code == 202, asked.text
        decision = asked.json()["decision"]

        with httpx.Client(base_url=daemon.url, timeout=WAIT_BOUND_S) as browser:
            login = browser.post(
                "/console/login",
                data={"token": daemon.token, "next": "/"},
                headers={"origin": daemon.url},
            )
            assert login.status_code == 303, login.text
            home = browser.get("/")
            assert home.status_code == 200
            assert f'data-testid="decision-{decision}"' in home.text
            found = CSRF.search(home.text)
            assert found is not None

            with browser.stream("GET", "/console/stream") as stream:
                assert stream.status_code == 200
                lines = stream.iter_lines()
                assert any(line == "event: hello" for line in lines)

            answer = browser.post(
                f"/console/decisions/{decision}",
                data={"answer": "approve", "why": "release checked", "csrf": found.group(1)},
            )
            assert answer.status_code == 303, answer.text

        resolved = api.get(f"/decisions/{decision}").json()
        assert (resolved["answer"], resolved["by"], resolved["why"]) == (
            "approve",
            "operator",
            "release checked",
        )
