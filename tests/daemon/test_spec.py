"""parse_spec: what reaches a process must be something a process can be given."""

from __future__ import annotations

from typing import Any

import pytest

from corral.daemon import InvalidSpecError, parse_spec

BASE: dict[str, Any] = {"name": "w", "harness": "command", "command": ["worker"]}


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"command": ["work\0er"]}, "command", "NUL"),
        ({"name": "w\0"}, "name", "NUL"),
        ({"env": {"A=B": "x"}}, "env.A=B", "'='"),
        ({"env": {"": "x"}}, "env.", "non-empty"),
        ({"env": {"A\0": "x"}}, "env.A\0", "NUL"),
        ({"env": {"A": "x\0y"}}, "env.A", "NUL"),
    ],
)
def test_what_a_process_cannot_take_is_refused_up_front(
    fields: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(InvalidSpecError) as info:
        parse_spec({**BASE, **fields})
    (problem,) = info.value.problems
    assert problem["field"] == field
    assert words in problem["message"]
    assert info.value.code == "invalid_spec"


def test_every_problem_is_listed_at_once() -> None:
    with pytest.raises(InvalidSpecError) as info:
        parse_spec({**BASE, "name": "a\0", "command": ["\0"], "env": {"=": "\0"}})
    assert [p["field"] for p in info.value.problems] == ["name", "command", "env.=", "env.="]
    assert "4 problem(s)" in info.value.message


def test_ordinary_names_and_values_pass() -> None:
    spec = parse_spec({**BASE, "name": "indexer 2", "env": {"MODE": "a=b c", "_X1": ""}})
    assert spec.env == {"MODE": "a=b c", "_X1": ""}
