"""Tool.from_schema: a tool described in data, and a ToolError a tool raises itself."""

import threading
from typing import Any

import pytest

from corral.agent import Agent, Tool, ToolError
from corral.kernel import InvalidArgumentError
from corral.runtime import ScriptedClient

text = ScriptedClient.text_reply
call = ScriptedClient.tool_call_reply

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"table": {"type": "string"}},
    "required": ["table"],
}


async def test_the_schema_is_offered_as_given_and_the_arguments_arrive_as_one_dict() -> None:
    seen: list[dict[str, Any]] = []

    async def inspect_table(arguments: dict[str, Any]) -> str:
        seen.append(arguments)
        return f"{arguments['table']} has 3 rows"

    t = Tool.from_schema(
        inspect_table, name="inspect", description="look at a table", parameters=SCHEMA
    )
    assert (t.name, t.description, t.spec.parameters) == ("inspect", "look at a table", SCHEMA)
    assert t.spec.parameters is not SCHEMA  # a copy: the caller's dict may change later
    client = ScriptedClient([call("inspect", {"table": "users", "extra": 1}), text("done")])
    run = await Agent(client, tools=[t]).run("go")
    assert client.requests[0].tools == (t.spec,)
    assert [(o.status, o.output) for o in run.tool_calls] == [("ok", "users has 3 rows")]
    assert seen == [{"table": "users", "extra": 1}]  # not checked against the schema


async def test_a_plain_function_runs_in_a_thread_and_results_become_text() -> None:
    threads: list[int] = []

    def count(arguments: dict[str, Any]) -> dict[str, int]:
        threads.append(threading.get_ident())
        return {"rows": len(arguments)}

    t = Tool.from_schema(count, name="count", parameters={"type": "object"})
    assert await t.call({"a": 1, "b": 2}) == '{"rows": 2}'
    assert threads[0] != threading.get_ident()


async def test_a_tool_error_raised_by_the_tool_reaches_the_model_as_it_is() -> None:
    class TableMissingError(ToolError):
        code = "tool_failed"

    async def drop(arguments: dict[str, Any]) -> str:
        raise TableMissingError(f"no table {arguments['table']!r}")

    async def plain(arguments: dict[str, Any]) -> str:
        raise ConnectionError("down")

    drop_tool = Tool.from_schema(drop, name="drop", parameters=SCHEMA)
    plain_tool = Tool.from_schema(plain, name="plain", parameters=SCHEMA)
    client = ScriptedClient(
        [call("drop", {"table": "users"}), call("plain", {"table": "x"}), text("ok")]
    )
    run = await Agent(client, tools=[drop_tool, plain_tool]).run("go")
    first, second = run.tool_calls
    assert (first.status, first.output) == ("error", "error: no table 'users'")
    assert (second.status, second.error_code) == ("error", "tool_failed")
    assert "tool 'plain' raised ConnectionError: down" in second.output


async def test_a_schema_tool_still_needs_an_object() -> None:
    t = Tool.from_schema(lambda arguments: "x", name="t", parameters={"type": "object"})
    with pytest.raises(InvalidArgumentError, match="arguments must be a Mapping"):
        await t.call(["x"])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "argument"),
    [
        ({"fn": "not callable"}, "fn"),
        ({"name": ""}, "name"),
        ({"description": None}, "description"),
        ({"parameters": {"type": "array"}}, "parameters"),
        ({"parameters": ["type", "object"]}, "parameters"),
        ({"parameters": {"type": "object", "default": float("nan")}}, "parameters"),
        ({"parameters": {"type": "object", "default": object()}}, "parameters"),
    ],
)
def test_bad_definitions_are_refused(fields: dict[str, Any], argument: str) -> None:
    given: dict[str, Any] = {
        "fn": lambda arguments: "x",
        "name": "t",
        "parameters": {"type": "object"},
        **fields,
    }
    fn = given.pop("fn")
    with pytest.raises(InvalidArgumentError) as caught:
        Tool.from_schema(fn, **given)
    assert caught.value.argument == argument
