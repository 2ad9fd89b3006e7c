"""Guardrail rules: what a spec or the rules file may say, and how an action is checked."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from corral.daemon import GuardrailsFileError, InvalidRequestError, InvalidSpecError, http_status
from corral.daemon.guardrails import (
    DEFAULT_ASK_TIMEOUT_S,
    MAX_ACTION_CHARS,
    MAX_RULES,
    AskRequest,
    CustomRule,
    EffectiveRule,
    MatchRule,
    Rule,
    _regex,
    check_custom,
    effective_rules,
    evaluate,
    has_custom,
    load_rules_file,
    parse_rules,
    rule_to_json,
)
from corral.guard import GuardrailResult, GuardrailWarning
from corral.kernel import InvalidArgumentError
from tests.daemon.workers import guardrail_rules
from tests.daemon.workers.guardrail_rules import MODULE
from tests.support.polling import settle

# Backtracks without end on a run of a's that does not end the string: the search times out.
CATASTROPHIC = r"(a|aa)+$"
SLOW_ACTION = "a" * 64 + "!"


def rules(*data: dict[str, Any]) -> tuple[Rule, ...]:
    return parse_rules(list(data))


class Asks:
    """An on_ask that keeps the requests for the test to answer."""

    def __init__(self) -> None:
        self.seen: list[AskRequest] = []

    def __call__(self, ask: AskRequest) -> None:
        self.seen.append(ask)

    async def next(self, count: int = 1) -> AskRequest:
        await settle(lambda: len(self.seen) >= count)
        return self.seen[count - 1]


def nobody(ask: AskRequest) -> None:
    raise AssertionError(f"nobody should be asked, but rule {ask.index} asked")


async def check(
    given: tuple[Rule, ...] | tuple[EffectiveRule, ...],
    action: str,
    on_ask: Callable[[AskRequest], object] = nobody,
    context: Mapping[str, object] | None = None,
) -> GuardrailResult:
    return await evaluate(given, "a_worker", action, context, on_ask)


# --- matching -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "action"),
    [
        ("deploy", "Redeploy the cache"),
        ("DROP TABLE", "sql: drop table users"),
        ("straße", "STRASSE cleanup"),  # case folding, as HumanApproval's patterns
    ],
)
async def test_a_match_string_is_a_substring_ignoring_case(pattern: str, action: str) -> None:
    given = rules({"match": pattern, "verdict": "block", "reason": "not that"})
    result = await check(given, action)
    assert (result.allowed, result.reason) == (False, "not that")
    assert (await check(given, "read the logs")) is GuardrailResult.allow()


async def test_a_regex_is_searched_as_written() -> None:
    given = rules({"match": {"regex": r"\bprod(uction)?\b"}, "verdict": "block"})
    assert (await check(given, "deploy web to prod")).allowed is False
    assert (await check(given, "deploy to production now")).allowed is False
    assert (await check(given, "the product page")).allowed is True
    assert (await check(given, "deploy to PROD")).allowed is True  # case counts
    ignoring_case = rules({"match": {"regex": r"(?i)\bprod\b"}, "verdict": "block"})
    assert (await check(ignoring_case, "deploy to PROD")).allowed is False


async def test_a_block_without_a_reason_names_its_rule() -> None:
    given = rules({"match": "ok", "verdict": "warn"}, {"match": "rm", "verdict": "block"})
    result = await check(given, "rm -rf / ok")
    assert result.reason == "rule 1 blocks this action"
    assert result.warnings == (GuardrailWarning("rule 0", "rule 0 warns about it"),)


@pytest.mark.parametrize("verdict", ["block", "warn", "allow", "ask"])
async def test_a_regex_that_takes_too_long_blocks(verdict: str) -> None:
    given = rules({"match": {"regex": CATASTROPHIC}, "verdict": verdict})
    result = await check(given, SLOW_ACTION)
    assert result.allowed is False
    assert result.reason is not None
    assert "rule 0's regex took longer than 0.05 s" in result.reason
    assert "blocked to be safe" in result.reason
    # The same rule on an action it searches quickly gives its verdict.
    assert (await check(given, "b" * 100)).allowed is True


async def test_the_regex_budget_of_one_check_is_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_regex, "REGEX_BUDGET_S", 0.0)
    given = rules(
        {"match": "never", "verdict": "block"},
        {"match": {"regex": "x"}, "verdict": "warn"},
    )
    result = await check(given, "x")
    assert result.allowed is False
    assert result.reason is not None
    assert "rule 1 was not checked: the rules' regexes already took 0 s" in result.reason


# --- order --------------------------------------------------------------------------------


async def test_the_first_block_wins() -> None:
    given = rules(
        {"match": "prod", "verdict": "block", "reason": "first"},
        {"match": "deploy", "verdict": "block", "reason": "second"},
    )
    assert (await check(given, "deploy prod")).reason == "first"
    assert (await check(given, "deploy staging")).reason == "second"


async def test_warnings_met_before_a_block_are_kept() -> None:
    given = rules(
        {"match": "migrate", "verdict": "warn", "reason": "watch the lock time"},
        {"match": "users", "verdict": "warn", "reason": "personal data"},
        {"match": "drop", "verdict": "block", "reason": "no schema changes"},
        {"match": "table", "verdict": "warn", "reason": "never reached"},
    )
    result = await check(given, "migrate users: drop table")
    assert (result.allowed, result.reason) == (False, "no schema changes")
    assert result.warnings == (
        GuardrailWarning("rule 0", "watch the lock time"),
        GuardrailWarning("rule 1", "personal data"),
    )
    allowed = await check(given, "migrate users")
    assert allowed.allowed is True
    assert [w.reason for w in allowed.warnings] == ["watch the lock time", "personal data"]


async def test_a_matching_allow_ends_the_check() -> None:
    Keyword = guardrail_rules.Keyword
    given = rules(
        {"match": "status", "verdict": "allow"},
        {"match": "prod", "verdict": "block", "reason": "not prod"},
        {"match": "prod", "verdict": "ask"},
        {"guardrail": f"{MODULE}:Keyword", "options": {"word": "allow-ends-it"}},
    )
    Keyword.made = 0
    assert (await check(given, "status of prod")) is GuardrailResult.allow()
    assert Keyword.made == 0  # the rules after the allow were not even made
    assert (await check(given, "deploy prod")).reason == "not prod"


async def test_an_allow_does_not_undo_what_came_before_it() -> None:
    given = rules(
        {"match": "prod", "verdict": "block", "reason": "not prod"},
        {"match": "status", "verdict": "warn", "reason": "noted"},
        {"match": "status", "verdict": "allow"},
    )
    assert (await check(given, "status of prod")).reason == "not prod"
    result = await check(given, "status of staging")
    assert result.allowed is True
    assert result.warnings == (GuardrailWarning("rule 1", "noted"),)


# --- custom rules -------------------------------------------------------------------------


async def test_a_custom_rule_answers_as_its_guardrail() -> None:
    given = rules(
        {"guardrail": f"{MODULE}:Keyword", "options": {"word": "prod", "warn": True}},
        {"guardrail": f"{MODULE}:AsyncKeyword", "options": {"word": "drop"}, "name": "no-drop"},
    )
    result = await check(given, "prod: drop", context={"where": "shell"})
    assert (result.allowed, result.reason) == (False, "a_worker said drop (shell)")
    assert result.warnings == (GuardrailWarning("rule 0", "a_worker said prod (shell)"),)
    assert has_custom(given)
    assert not has_custom(rules({"match": "x", "verdict": "warn"}))


async def test_custom_instances_are_cached_by_path_and_options() -> None:
    Keyword = guardrail_rules.Keyword
    word = f"cache-{uuid.uuid4().hex}"  # options no other test made an instance for

    def keyword(options: dict[str, Any]) -> tuple[Rule, ...]:
        return parse_rules([{"guardrail": f"{MODULE}:Keyword", "options": options}])

    Keyword.made = 0
    one = keyword({"word": word, "warn": False})
    assert Keyword.made == 1  # made once to check it can be
    same = keyword({"warn": False, "word": word})
    Keyword.made = 0
    other = parse_rules(
        [{"guardrail": f"{MODULE}:Keyword", "options": {"word": word, "warn": True}}],
        import_custom=False,
    )
    for _ in range(3):
        await check(one, "x")
        await check(same, "x")
    assert Keyword.made == 0
    await check(other, "x")
    await check(other, "x")
    assert Keyword.made == 1


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("Raising", "Guardrail error: the rule fell over"),
        (
            "WrongAnswer",
            "Guardrail error: guardrail 'rule 0' answered 'yes', not a GuardrailResult",
        ),
    ],
)
async def test_a_custom_rule_that_fails_blocks(name: str, reason: str) -> None:
    given = rules({"guardrail": f"{MODULE}:{name}"}, {"match": "x", "verdict": "allow"})
    result = await check(given, "x")
    assert (result.allowed, result.reason) == (False, reason)


@pytest.mark.parametrize(
    ("path", "options", "words"),
    [
        ("tests.daemon.workers.no_such_module:X", {}, "cannot import 'tests.daemon.workers.no_"),
        ("tests.daemon.workers.broken_import:X", {}, "RuntimeError: broken on purpose"),
        (f"{MODULE}:Missing", {}, f"module {MODULE!r} has no 'Missing'"),
        (f"{MODULE}:NOT_CALLABLE", {}, "is not a class or a function"),
        (f"{MODULE}:BadInit", {}, "raised ValueError: cannot start"),
        (f"{MODULE}:Keyword", {"wrod": "x"}, "raised TypeError"),
        (f"{MODULE}:Nameless", {}, "not a guardrail: it needs a non-empty string 'name'"),
        (f"{MODULE}:NoCheck", {}, "made NoCheck, not a guardrail"),
    ],
)
async def test_a_custom_rule_that_cannot_be_made_is_a_problem(
    path: str, options: dict[str, Any], words: str
) -> None:
    data = [{"match": "x", "verdict": "warn"}, {"guardrail": path, "options": options}]
    with pytest.raises(InvalidSpecError) as info:
        parse_rules(data)
    (problem,) = info.value.problems
    assert problem["field"] == "guardrails[1].guardrail"
    assert words in problem["message"]
    # Left unimported, the rule blocks when it is first checked: it fails closed.
    given = parse_rules(data, import_custom=False)
    result = await check(given, "x")
    assert result.allowed is False
    assert result.reason is not None
    assert words in result.reason


def test_check_custom_names_every_failing_rule() -> None:
    given = parse_rules(
        [
            {"guardrail": f"{MODULE}:BadInit"},
            {"guardrail": f"{MODULE}:Keyword", "options": {"word": "fine"}},
            {"guardrail": f"{MODULE}:NoCheck"},
        ],
        import_custom=False,
    )
    with pytest.raises(InvalidSpecError) as info:
        check_custom(given, "policy")
    assert [p["field"] for p in info.value.problems] == [
        "policy[0].guardrail",
        "policy[2].guardrail",
    ]


# --- ask ----------------------------------------------------------------------------------


async def test_an_ask_calls_on_ask_and_an_approval_lets_later_rules_run() -> None:
    asks = Asks()
    given = rules(
        {"match": "status", "verdict": "warn", "reason": "noted"},
        {"match": "deploy", "verdict": "ask", "reason": "deploys need a person"},
        {"match": "friday", "verdict": "block", "reason": "not on a friday"},
        {"match": "prod", "verdict": "warn", "reason": "prod"},
    )
    context = {"ticket": 7}
    task = asyncio.create_task(check(given, "deploy prod", asks, context))
    ask = await asks.next()
    assert ask.index == 1
    assert ask.rule == EffectiveRule(given[1], None, 1)
    assert (ask.request.agent_id, ask.request.action) == ("a_worker", "deploy prod")
    assert ask.request.context == context
    assert (ask.timeout_s, ask.on_timeout) == (DEFAULT_ASK_TIMEOUT_S, "deny")
    assert not task.done()
    ask.request.approve()
    result = await task
    assert result.allowed is True
    assert result.warnings == (GuardrailWarning("rule 3", "prod"),)
    # Approved, the rules after the ask still have their say.
    task = asyncio.create_task(check(given, "deploy on friday", asks))
    (await asks.next(2)).request.approve()
    assert (await task).reason == "not on a friday"


async def test_a_denied_ask_blocks_and_later_rules_do_not_run() -> None:
    asks = Asks()
    given = rules(
        {"match": {"regex": r"^deploy\b"}, "verdict": "ask", "timeoutS": 60, "onTimeout": "allow"},
        {"match": "deploy", "verdict": "ask"},
    )
    task = asyncio.create_task(check(given, "deploy web", asks))
    ask = await asks.next()
    assert (ask.index, ask.timeout_s, ask.on_timeout) == (0, 60, "allow")
    ask.request.deny()
    result = await task
    assert (result.allowed, result.reason) == (False, "Approval for action 'deploy web' was denied")
    assert len(asks.seen) == 1  # rule 1 was not asked
    task = asyncio.create_task(check(given, "redeploy", asks))  # only rule 1 matches
    ask = await asks.next(2)
    assert ask.index == 1
    ask.request.deny()
    assert (await task).allowed is False


async def test_an_async_on_ask_is_awaited_and_a_raising_one_blocks() -> None:
    given = rules({"match": "deploy", "verdict": "ask"})

    async def approve_later(ask: AskRequest) -> None:
        await asyncio.sleep(0)
        ask.request.approve()

    assert (await check(given, "deploy", approve_later)).allowed is True

    def broken(ask: AskRequest) -> None:
        raise RuntimeError("inbox full")

    result = await check(given, "deploy", broken)
    assert (result.allowed, result.reason) == (
        False,
        "Approval request for action 'deploy' failed: inbox full",
    )


async def test_two_asks_are_put_one_after_the_other() -> None:
    asks = Asks()
    given = rules({"match": "deploy", "verdict": "ask"}, {"match": "prod", "verdict": "ask"})
    task = asyncio.create_task(check(given, "deploy prod", asks))
    (await asks.next()).request.approve()
    second = await asks.next(2)
    assert second.index == 1
    second.request.approve()
    assert (await task).allowed is True


async def test_checks_at_once_over_equal_rules_each_ask_their_own() -> None:
    first, second = Asks(), Asks()
    data: dict[str, Any] = {"match": "deploy", "verdict": "ask"}
    one, other = rules(data), rules(data)  # equal rules, separate objects
    task_one = asyncio.create_task(check(one, "deploy one", first))
    task_other = asyncio.create_task(check(other, "deploy other", second))
    ask_one, ask_other = await first.next(), await second.next()
    assert (ask_one.request.action, ask_other.request.action) == ("deploy one", "deploy other")
    ask_other.request.deny()
    assert (await task_other).allowed is False
    assert not task_one.done()
    ask_one.request.approve()
    assert (await task_one).allowed is True
    assert (len(first.seen), len(second.seen)) == (1, 1)


# --- effective rules ----------------------------------------------------------------------


async def test_effective_rules_put_the_daemon_first_then_the_chain_root_first() -> None:
    daemon = rules({"match": "deploy", "verdict": "block", "reason": "policy"})
    root = rules({"match": "a", "verdict": "warn", "reason": "root"})
    child = rules({"match": "deploy", "verdict": "allow"}, {"match": "b", "verdict": "warn"})
    found = effective_rules(daemon, [("a_root", root), ("a_mid", ()), ("a_child", child)])
    assert [(r.source, r.index, r.rule) for r in found] == [
        ("daemon", 0, daemon[0]),
        ("a_root", 0, root[0]),
        ("a_child", 0, child[0]),
        ("a_child", 1, child[1]),
    ]
    assert [r.label for r in found] == [
        "daemon rule 0",
        "agent a_root rule 0",
        "agent a_child rule 0",
        "agent a_child rule 1",
    ]
    # The child's allow cannot undo the daemon's block, which comes first.
    result = await check(found, "a deploy")
    assert (result.allowed, result.reason) == (False, "policy")
    # Without the daemon's rule, the child's allow ends the check before its own later rule;
    # the root's warning, met before it, stays.
    result = await check(found[1:], "a deploy b")
    assert result.allowed is True
    assert result.warnings == (GuardrailWarning("agent a_root rule 0", "root"),)


async def test_an_ask_tells_which_rule_of_which_source_asked() -> None:
    asks = Asks()
    found = effective_rules(
        rules({"match": "zzz", "verdict": "block"}),
        [("a_lead", rules({"match": "deploy", "verdict": "ask"}))],
    )
    task = asyncio.create_task(check(found, "deploy", asks))
    ask = await asks.next()
    assert (ask.index, ask.rule.source, ask.rule.index) == (1, "a_lead", 0)
    ask.request.approve()
    assert (await task).allowed is True


@pytest.mark.parametrize("agent_id", ["", "daemon", 7])
def test_effective_rules_refuse_bad_chain_ids(agent_id: object) -> None:
    with pytest.raises(InvalidArgumentError):
        effective_rules((), [(agent_id, ())])  # type: ignore[list-item]
    with pytest.raises(InvalidArgumentError, match="already in the chain"):
        effective_rules((), [("a_1", ()), ("a_1", ())])


def test_rule_to_json_shows_a_rule_without_empty_fields() -> None:
    ask, block, custom = rules(
        {"match": "deploy", "verdict": "ask"},
        {"match": {"regex": "x+"}, "verdict": "block", "reason": "no"},
        {"guardrail": f"{MODULE}:Keyword", "options": {"word": "w", "warn": None}, "name": "kw"},
    )
    assert rule_to_json(ask) == {
        "match": "deploy",
        "verdict": "ask",
        "timeoutS": DEFAULT_ASK_TIMEOUT_S,
        "onTimeout": "deny",
    }
    assert rule_to_json(block) == {"match": {"regex": "x+"}, "verdict": "block", "reason": "no"}
    assert rule_to_json(custom) == {
        "guardrail": f"{MODULE}:Keyword",
        "options": {"word": "w", "warn": None},
        "name": "kw",
    }
    (effective,) = effective_rules((), [("a_1", (block,))])
    assert rule_to_json(effective) == {**rule_to_json(block), "source": "a_1", "index": 0}
    # What it shows parses back to the same rule.
    assert parse_rules([rule_to_json(r) for r in (ask, block)]) == (ask, block)


# --- the rules file -----------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["list", "object"])
def test_the_rules_file_holds_a_list_or_an_object(tmp_path: Path, shape: str) -> None:
    data: list[dict[str, Any]] = [
        {"match": "drop table", "verdict": "block", "reason": "no schema changes"},
        {"guardrail": f"{MODULE}:Keyword", "options": {"word": "file"}},
    ]
    path = tmp_path / "rules.json"
    path.write_text(json.dumps(data if shape == "list" else {"guardrails": data}))
    found = load_rules_file(path)
    assert [rule_to_json(r) for r in found] == data
    assert isinstance(found[1], CustomRule)


def _file(tmp_path: Path, content: bytes) -> Path:
    path = tmp_path / "rules.json"
    path.write_bytes(content)
    return path


@pytest.mark.parametrize(
    ("make", "field", "words"),
    [
        (lambda p: p / "missing.json", "(file)", "does not exist"),
        (lambda p: p, "(file)", "is not a regular file"),
        (
            lambda p: _file(p, b"\xff[]"),
            "(file)",
            "is not UTF-8 text: invalid start byte at byte 0",
        ),
        (lambda p: _file(p, b"[\n{,"), "(file)", "is not JSON: Expecting property name"),
        (lambda p: _file(p, b"[" * 100_000), "(file)", "nests too deeply"),
        (lambda p: _file(p, b"7"), "(file)", "must hold a list of rules"),
        (lambda p: _file(p, b'{"rules": []}'), "rules", "unknown field"),
        (lambda p: _file(p, b"{}"), "guardrails", "must hold a list of rules"),
        (lambda p: _file(p, b" " * (1 << 20) + b"[]"), "(file)", "is larger than 1048576 bytes"),
        (
            lambda p: _file(p, b'[{"match": "x", "verdict": "block"}, {"match": "y"}]'),
            "guardrails[1].verdict",
            "Field required",
        ),
        (
            lambda p: _file(p, f'[{{"guardrail": "{MODULE}:BadInit"}}]'.encode()),
            "guardrails[0].guardrail",
            "cannot start",
        ),
    ],
)
def test_a_bad_rules_file_is_a_typed_error_naming_it(
    tmp_path: Path, make: Callable[[Path], Path], field: str, words: str
) -> None:
    path = make(tmp_path)
    with pytest.raises(GuardrailsFileError) as info:
        load_rules_file(path)
    error = info.value
    (problem,) = error.problems
    assert problem["field"] == field
    assert words in problem["message"]
    assert error.message.startswith(f"invalid guardrails file {str(path)!r}: 1 problem(s)")
    assert (error.code, error.path, http_status(error)) == (
        "invalid_guardrails_file",
        str(path),
        400,
    )
    assert isinstance(error, InvalidSpecError)


def test_a_fifo_is_not_waited_on(tmp_path: Path) -> None:
    path = tmp_path / "rules.fifo"
    os.mkfifo(path)
    with pytest.raises(GuardrailsFileError, match="is not a regular file"):
        load_rules_file(path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_rules_file_says_so(tmp_path: Path) -> None:
    path = _file(tmp_path, b"[]")
    path.chmod(0)
    with pytest.raises(GuardrailsFileError, match="cannot be read: permission denied"):
        load_rules_file(path)


# --- hostile input ------------------------------------------------------------------------

OK: dict[str, Any] = {"match": "x", "verdict": "block"}


@pytest.mark.parametrize(
    ("rule", "field", "words"),
    [
        ({**OK, "match": "de\ud800ploy"}, "match", "lone surrogates"),
        ({**OK, "match": "a\0b"}, "match", "NUL"),
        ({**OK, "match": "  "}, "match", "empty or only blanks"),
        ({**OK, "match": ""}, "match", "empty or only blanks"),
        ({**OK, "match": "x" * 1_000_000}, "match", "at most 1000 characters, got 1000000"),
        ({**OK, "match": ["deploy"]}, "match", "not list"),
        ({**OK, "match": None}, "match", "not NoneType"),
        ({**OK, "match": {"regex": "a\0"}}, "match.regex", "NUL"),
        ({**OK, "match": {"regex": "("}}, "match.regex", "not a valid regular expression"),
        ({**OK, "match": {"regex": ""}}, "match.regex", "empty"),
        ({**OK, "match": {"regex": "a" * 1001}}, "match.regex", "at most 1000 characters"),
        ({**OK, "match": {"regex": 5}}, "match.regex", "valid string"),
        ({**OK, "match": {"regex": "x", "i": 1}}, "match.i", "unknown field"),
        ({**OK, "match": {"regex": "a{5000}"}}, "match.regex", "at most 1000"),
        ({**OK, "match": {"regex": "(?:a{100}){101}"}}, "match.regex", "multiply to more than"),
        ({**OK, "match": {"regex": "(?x)a{1 0 0 0 0 0}"}}, "match.regex", "at least 100000"),
        ({**OK, "verdict": "deny"}, "verdict", "'allow', 'warn', 'block' or 'ask'"),
        ({**OK, "verdict": 1}, "verdict", "'allow', 'warn', 'block' or 'ask'"),
        ({**OK, "reason": ""}, "reason", "empty"),
        ({**OK, "reason": "r" * 2001}, "reason", "at most 2000"),
        ({**OK, "reason": "\0"}, "reason", "NUL"),
        ({**OK, "timeoutS": 5}, "timeoutS", "only for verdict 'ask', not 'block'"),
        ({**OK, "onTimeout": "deny"}, "onTimeout", "only for verdict 'ask', not 'block'"),
        ({**OK, "verdict": "ask", "timeoutS": True}, "timeoutS", "valid number"),
        ({**OK, "verdict": "ask", "timeoutS": "5"}, "timeoutS", "valid number"),
        ({**OK, "verdict": "ask", "timeoutS": 0}, "timeoutS", "greater than 0"),
        ({**OK, "verdict": "ask", "timeoutS": float("nan")}, "timeoutS", "finite number"),
        ({**OK, "verdict": "ask", "timeoutS": 604_801}, "timeoutS", "less than or equal"),
        ({**OK, "verdict": "ask", "onTimeout": "maybe"}, "onTimeout", "'deny' or 'allow'"),
        ({**OK, "by": "me"}, "by", "unknown field"),
        ({"verdict": "block"}, "match", "Field required"),
        ({"guardrail": "no-colon"}, "guardrail", "must look like 'package.module:Class'"),
        ({"guardrail": "m:C", "options": []}, "options", "valid dictionary"),
        ({"guardrail": "m:C", "options": {"x": float("nan")}}, "options", "JSON object"),
        ({"guardrail": "m:C", "options": {"\ud800": 1}}, "options", "lone surrogates"),
        ({"guardrail": "m:C", "options": {"x": "y" * 20_000}}, "options", "at most 16384"),
        ({"guardrail": "m:C", "name": "a\x1b[31m"}, "name", "control characters"),
        ({"guardrail": "m:C", "match": "x"}, "match", "unknown field"),
    ],
)
def test_bad_rules_are_problems_at_their_path(rule: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(InvalidSpecError) as info:
        parse_rules([OK, rule])
    problems = info.value.problems
    assert any(
        p["field"] == f"guardrails[1].{field}" and words in p["message"] for p in problems
    ), problems
    assert info.value.code == "invalid_spec"


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ("deploy", "must be a list of rules, not str"),
        ({"match": "x"}, "must be a list of rules, not dict"),
        (None, "must be a list of rules, not NoneType"),
        ([OK] * (MAX_RULES + 1), f"may hold at most {MAX_RULES} rules, got {MAX_RULES + 1}"),
        ([OK] * 1_000_000, f"may hold at most {MAX_RULES} rules, got 1000000"),
    ],
)
def test_what_is_not_a_short_list_of_rules_is_one_problem(data: object, words: str) -> None:
    with pytest.raises(InvalidSpecError) as info:
        parse_rules(data)
    assert info.value.problems == [{"field": "guardrails", "message": words}]


@pytest.mark.parametrize("rule", [7, "deploy", None, [OK]])
def test_a_rule_that_is_not_an_object_is_a_problem(rule: object) -> None:
    with pytest.raises(InvalidSpecError) as info:
        parse_rules([OK, rule])
    (problem,) = info.value.problems
    assert problem["field"] == "guardrails[1]"
    assert problem["message"].startswith("must be an object")


def test_a_key_that_cannot_be_printed_is_escaped_in_the_path() -> None:
    with pytest.raises(InvalidSpecError) as info:
        parse_rules([{**OK, "\x1b[2J": 1}])
    assert info.value.problems == [
        {"field": "guardrails[0].\\u001b[2J", "message": "unknown field"}
    ]


@pytest.mark.parametrize(
    ("action", "words"),
    [
        ("x" * (MAX_ACTION_CHARS + 1), f"at most {MAX_ACTION_CHARS} characters"),
        ("deploy\0", "NUL"),
        ("deploy \udc80", "lone surrogates"),
        ("", "empty"),
        (" \n", "empty"),
        (42, "must be a string, not int"),
    ],
)
async def test_an_action_that_cannot_be_checked_is_refused(action: object, words: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        await evaluate((), "a_1", action, None, nobody)  # type: ignore[arg-type]
    (problem,) = info.value.problems
    assert problem["field"] == "action"
    assert words in problem["message"]


async def test_the_longest_action_is_checked_quickly_against_many_rules() -> None:
    action = "a" * (MAX_ACTION_CHARS - 1) + "!"
    given = rules(
        *[{"match": f"word{i}", "verdict": "block"} for i in range(MAX_RULES - 1)],
        {"match": {"regex": r"a{10}!"}, "verdict": "warn", "reason": "ten"},
    )
    result = await check(given, action)
    assert result.allowed is True
    assert [w.reason for w in result.warnings] == ["ten"]


@pytest.mark.parametrize(
    ("rules_", "agent_id", "context", "on_ask", "name"),
    [
        ((), "", None, nobody, "agent_id"),
        ((), "a_1", ["not", "a", "mapping"], nobody, "context"),
        ((), "a_1", None, "nobody", "on_ask"),
        (({"match": "x", "verdict": "block"},), "a_1", None, nobody, "rules[]"),
    ],
)
async def test_evaluate_refuses_bad_arguments(
    rules_: tuple[object, ...], agent_id: str, context: object, on_ask: object, name: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=name.replace("[", r"\[").replace("]", r"\]")):
        await evaluate(rules_, agent_id, "x", context, on_ask)  # type: ignore[arg-type]


async def test_no_rules_allow_everything() -> None:
    assert (await check((), "anything at all")) is GuardrailResult.allow()


def test_ask_defaults_fill_in_and_only_ask_gets_them() -> None:
    ask, warn = rules({"match": "x", "verdict": "ask", "timeoutS": None}, OK)
    assert isinstance(ask, MatchRule)
    assert isinstance(warn, MatchRule)
    assert (ask.timeout_s, ask.on_timeout) == (DEFAULT_ASK_TIMEOUT_S, "deny")
    assert (warn.timeout_s, warn.on_timeout) == (None, None)
