"""The README's example must run as written (pointed at the loopback model server)."""

import re
from pathlib import Path

import pytest

from tests.support.openai_server import OpenAIServer, completion, tool_call

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_example_runs(
    openai_server: OpenAIServer, capsys: pytest.CaptureFixture[str]
) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    example = next(b for b in blocks if "async def main" in b)
    assert "http://127.0.0.1:8000/v1" in example
    openai_server.enqueue(
        completion(tool_calls=[tool_call("lookup_order", {"order_id": 42})], model="my-model"),
        completion("Order 42 is open.", usage=(120, 8), model="my-model"),
    )
    code = example.replace("http://127.0.0.1:8000/v1", openai_server.base_url)
    exec(compile(code, str(README), "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    assert out.startswith("Order 42 is open. BudgetUsage(tokens=128")
    sent = openai_server.requests[1].json["messages"][-1]
    assert sent == {
        "role": "tool",
        "tool_call_id": sent["tool_call_id"],
        "content": '{"id": 42, "status": "open"}',
    }
