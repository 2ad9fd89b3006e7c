"""examples/integrations/langchain_agent.py: run as a script, its ``turn`` run by the daemon's
``python`` harness (an agent spawned over the daemon's HTTP app, in process, runs the LangChain
agent with corral inside in its worker process), and its lines the same as the manual's."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.daemon import AgentService, PythonHarness, SQLiteStore, create_app
from tests.support.front_door import LOCAL_URL

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "integrations" / "langchain_agent.py"
FUNCTION = "examples.integrations.langchain_agent:turn"


@pytest.mark.timeout(60)  # a fresh interpreter imports LangChain
def test_the_example_runs_and_shows_the_refusal_the_spend_and_the_budget_stop() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LANGSMITH", "LANGCHAIN"))}
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=50, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        'a person is asked: delete_rows {"table": "users"} -> no',
        "answer: users has 1204 rows; tool 'delete_rows' refused: Approval for action "
        '\'delete_rows {"table": "users"}\' was denied',
        "spent: 3840 tokens, $0.0114, 3 model calls",
        "stopped: budget_exhausted: cost_usd budget exhausted: used 0.0076 of a limit of 0.005",
    ]
    assert done.stderr == ""


def test_the_manual_shows_the_examples_lines() -> None:
    manual = (ROOT / "docs" / "integrations.md").read_text()
    section = manual.split("## LangChain", 1)[1].split("\n## ", 1)[0]
    shown = re.findall(r"```python\n(.*?)```", section, flags=re.S)[0]
    assert shown.strip() in EXAMPLE.read_text()


@pytest.mark.timeout(90)  # the worker imports LangChain (seconds on a busy machine)
async def test_the_python_harness_runs_the_langchain_agent_with_corral_inside(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "corral.db")
    await store.open()
    harness = PythonHarness()
    service = AgentService(store, home=tmp_path / "home", harnesses={"python": harness})
    try:
        await service.start()
        transport = httpx.ASGITransport(app=create_app(service))
        async with httpx.AsyncClient(transport=transport, base_url=LOCAL_URL) as api:
            spec = {
                "name": "cleaner",
                "harness": "python",
                "function": FUNCTION,
                "prompt": "Clean up the users table.",
                "turnTimeoutS": 60.0,
            }
            spawned = await api.post("/agents", json=spec)
            assert spawned.status_code == 201, spawned.text
            agent_id = spawned.json()["id"]
            record = await _until_settled(api, agent_id)
        assert record["state"] == "idle", record["lastError"]
        assert record["lastOutput"] == (
            "users has 1204 rows; tool 'delete_rows' refused: Approval for action "
            '\'delete_rows {"table": "users"}\' was denied'
        )
        # three model calls of 1,200 + 80 tokens at gpt-4o's price, as corral counted them
        assert record["usage"]["tokens"] == 3 * 1280
        assert record["usage"]["costUsd"] == pytest.approx(3 * (1200 * 2.5 + 80 * 10.0) / 1e6)
    finally:
        await service.close()
        await harness.aclose()
        await store.close()


async def _until_settled(api: httpx.AsyncClient, agent_id: str) -> dict[str, Any]:
    """Poll the agent until its turn has ended (the worker answers in real time)."""
    for _ in range(1200):
        response = await api.get(f"/agents/{agent_id}")
        record: dict[str, Any] = response.json()
        if record["turns"] >= 1 and record["turnInFlight"] is None:
            return record
        await asyncio.sleep(0.05)
    raise AssertionError(f"agent {agent_id} did not finish its turn within 60 s: {record}")
