"""Every complete example in docs/ (a python block that calls asyncio.run) must run."""

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
EXAMPLES = [
    pytest.param(block, id=f"{path.name}#{n}")
    for path in sorted(DOCS.glob("*.md"))
    for n, block in enumerate(re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S))
    if "asyncio.run(" in block
]


def test_there_are_examples_to_run() -> None:
    assert EXAMPLES


@pytest.mark.parametrize("code", EXAMPLES)
def test_doc_example_runs(code: str, capsys: pytest.CaptureFixture[str]) -> None:
    exec(compile(code, "<doc example>", "exec"), {"__name__": "doc_example"})
    assert capsys.readouterr().out.strip()
