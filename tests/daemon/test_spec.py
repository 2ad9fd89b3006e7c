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


GUARDED: dict[str, Any] = {
    **BASE,
    "guardrails": [
        {"match": "deploy", "verdict": "ask", "reason": "deploys need a person", "timeoutS": 600},
        {"match": {"regex": r"(?i)\bdrop\s+table\b"}, "verdict": "block"},
        {"guardrail": "tests.daemon.workers.guardrail_rules:Keyword", "options": {"word": "x"}},
    ],
    "mayAnswer": ["approval", "blocked"],
}


def test_guardrails_and_may_answer_round_trip() -> None:
    spec = parse_spec(GUARDED)
    again = parse_spec(spec.to_json())
    assert again == spec
    shown = spec.to_json()
    assert shown["mayAnswer"] == ["approval", "blocked"]
    assert shown["guardrails"][0] == {
        "match": "deploy",
        "verdict": "ask",
        "reason": "deploys need a person",
        "timeoutS": 600,
        "onTimeout": "deny",
    }
    assert shown["guardrails"][1]["match"] == {"regex": r"(?i)\bdrop\s+table\b"}
    assert len(spec.guardrails) == 3


def test_a_spec_has_no_guardrails_and_answers_nothing_by_default() -> None:
    spec = parse_spec(BASE)
    assert (spec.guardrails, spec.may_answer) == ((), [])
    assert (spec.to_json()["guardrails"], spec.to_json()["mayAnswer"]) == ([], [])


def test_validating_a_spec_never_imports_a_custom_rule() -> None:
    # The module raises when imported: the spec is still only validated. Whoever may run code
    # in the daemon imports it later (corral.daemon.guardrails.check_custom).
    spec = parse_spec(
        {**BASE, "guardrails": [{"guardrail": "tests.daemon.workers.broken_import:X"}]}
    )
    assert spec.guardrails[0].guardrail == "tests.daemon.workers.broken_import:X"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"guardrails": [{"match": "x", "verdict": "no"}]}, "guardrails[0].verdict", "'allow'"),
        (
            {
                "guardrails": [
                    {"match": "x", "verdict": "warn"},
                    {"match": {"regex": "(("}, "verdict": "block"},
                ]
            },
            "guardrails[1].match.regex",
            "not a valid regular expression",
        ),
        (
            {"guardrails": [{"match": "x", "verdict": "warn", "timeoutS": 5}]},
            "guardrails[0].timeoutS",
            "only for verdict 'ask'",
        ),
        ({"guardrails": [{"match": "x\0", "verdict": "warn"}]}, "guardrails[0].match", "NUL"),
        (
            {"guardrails": [{"match": "x", "verdict": "warn"}] * 101},
            "guardrails",
            "at most 100 rules",
        ),
        ({"guardrails": {"match": "x"}}, "guardrails", "must be a list of rules"),
        ({"mayAnswer": ["approval", "reinstate"]}, "mayAnswer[1]", "'blocked' or 'approval'"),
        ({"mayAnswer": "approval"}, "mayAnswer", "valid list"),
        ({"mayAnswer": ["blocked", "blocked"]}, "mayAnswer[1]", "listed twice"),
    ],
)
def test_bad_guardrails_and_may_answer_are_problems_at_their_path(
    fields: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(InvalidSpecError) as info:
        parse_spec({**BASE, **fields})
    (problem,) = info.value.problems
    assert problem["field"] == field
    assert words in problem["message"]
