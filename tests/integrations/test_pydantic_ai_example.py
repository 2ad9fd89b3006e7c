"""examples/integrations/pydantic_ai_agent.py: run as a script, shown in the docs, and run as
a daemon agent's turns through the python harness (an in-process service, no real serve)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from corral.daemon import AgentService, PythonHarness, SQLiteStore

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "integrations" / "pydantic_ai_agent.py"
FUNCTION = "examples.integrations.pydantic_ai_agent:turn"


def test_the_example_runs_and_shows_the_refusal_and_the_spend() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=25, check=True
    )
    lines = done.stdout.splitlines()
    assert lines[0] == 'asked a person: may support-bot refund {"order_id": 0}? no'
    assert '"lookup_order":"order 0: 2 items, paid"' in lines[1]
    assert '"refund":"tool \'refund\' refused: Approval for action' in lines[1]
    assert re.match(r"BudgetUsage\(tokens=\d+, cost_usd=0\.000\d+, turns=2, ", lines[2])
    assert done.stderr == ""


def test_the_docs_show_the_example_as_it_is() -> None:
    docs = (ROOT / "docs" / "integrations.md").read_text()
    section = docs.split("\n## Pydantic AI\n", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```python\n(.*?)```", section, flags=re.S)[0]
    assert block in EXAMPLE.read_text()
    assert "CorralCapability(" in block


async def test_the_example_runs_as_a_daemon_agent_through_the_python_harness(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "corral.db")
    await store.open()
    harness = PythonHarness()
    service = AgentService(store, home=tmp_path / "home", harnesses={"python": harness})
    await service.start()
    try:
        spec: dict[str, Any] = {"name": "support", "harness": "python", "function": FUNCTION}
        agent_id = (await service.spawn({**spec, "prompt": "refund order 7"})).body["id"]
        await service.settled(agent_id)
        record = service.get(agent_id)
        assert record["state"] == "idle", record
        assert "tool 'refund' refused" in record["lastOutput"]
        assert '"lookup_order":"order 0: 2 items, paid"' in record["lastOutput"]
        assert record["usage"]["tokens"] > 0
        assert 0 < record["usage"]["costUsd"] < 0.01
    finally:
        await service.close()
        await store.close()
