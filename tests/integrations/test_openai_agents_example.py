"""examples/integrations/openai_agents_agent.py: it runs as a script, as a daemon agent
through the python harness, and its ten lines are the ones docs/integrations.md shows."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from corral.daemon import AgentService, PythonHarness, SQLiteStore

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "integrations" / "openai_agents_agent.py"
FUNCTION = "examples.integrations.openai_agents_agent:turn"
REFUSAL = (
    "I could not do it: tool 'delete_rows' refused: "
    """Approval for action 'delete_rows {"table": "test_accounts"}' was denied"""
)


# Each starts a process that imports the SDK (seconds of CPU; more on a loaded machine).
@pytest.mark.timeout(90)
def test_the_example_runs_offline_and_a_person_says_no() -> None:
    done = subprocess.run(
        [sys.executable, "-W", "error", str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=25,
        check=True,
    )
    assert done.stdout.splitlines() == [
        """asked a person: may ops run delete_rows {"table": "test_accounts"}? -> no""",
        f"agent: {REFUSAL}",
        "spent: 300 tokens, $0.000192, 2 model calls",
    ]
    assert done.stderr == ""


@pytest.mark.timeout(90)
async def test_the_example_runs_as_a_daemon_agent_through_the_python_harness(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "corral.db")
    await store.open()
    harness = PythonHarness()
    service = AgentService(store, home=tmp_path / "home", harnesses={"python": harness})
    try:
        await service.start()
        spec = {
            "name": "ops",
            "harness": "python",
            "function": FUNCTION,
            "prompt": "empty the table test_accounts",
        }
        agent_id = (await service.spawn(spec)).body["id"]
        await service.settled(agent_id)
        record = service.get(agent_id)
        assert (record["state"], record["lastError"]) == ("idle", None), record
        assert record["lastOutput"] == REFUSAL
        assert record["usage"]["tokens"] == 300
        assert record["usage"]["costUsd"] == 0.000192
    finally:
        await service.close()
        await harness.aclose()
        await store.close()


def _region(text: str, name: str) -> str:
    found = re.search(rf"# --- corral: {name} ---\n(.*?)\n\s*# --- end ---", text, flags=re.S)
    assert found, f"no region {name!r} in the example"
    return textwrap.dedent(found.group(1)).strip()


def test_the_docs_show_the_examples_ten_lines() -> None:
    example = EXAMPLE.read_text()
    docs = (ROOT / "docs" / "integrations.md").read_text()
    section = docs.split("## OpenAI Agents SDK", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```python\n(.*?)```", section, flags=re.S)
    assert block, "no python block in the OpenAI Agents SDK section"
    shown = block.group(1).strip()
    assert shown == _region(example, "imports") + "\n\n" + _region(example, "the run")
