"""OpenTelemetry spans of the library: the ``Tracing`` middleware around a turn, its model
calls and tool calls, in the trace the run's ``trace_id`` names; and corral without
OpenTelemetry at all."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from corral.agent import Agent, ToolError
from corral.kernel import RunMeta
from corral.runtime import Cancellation, ScriptedClient, Tracing
from corral.runtime._tracing import otel_root_span_id, otel_trace_id
from tests.support.tracing import spans  # noqa: F401  (a fixture)

text = ScriptedClient.text_reply
call = ScriptedClient.tool_call_reply


def test_the_trace_id_is_derived_from_the_run_s_trace_id() -> None:
    hex_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    assert otel_trace_id(hex_id) == int(hex_id, 16)  # RunMeta's default: used as it is
    assert otel_trace_id("run-1") == otel_trace_id("run-1") != otel_trace_id("run-2")
    assert 0 < otel_trace_id("0" * 32) < 1 << 128  # the invalid all-zero id is hashed
    assert 0 < otel_root_span_id("run-1") < 1 << 64


async def test_a_run_s_turn_model_and_tool_calls_are_one_trace(
    spans: InMemorySpanExporter,  # noqa: F811
) -> None:
    def lookup(order: int) -> str:
        return f"order {order}: shipped"

    client = ScriptedClient(
        [
            call("lookup", {"order": 7}, prompt_tokens=11, completion_tokens=3),
            text("it shipped", prompt_tokens=20, completion_tokens=4, cost_usd=0.01),
        ]
    )
    meta = RunMeta(cancellation=Cancellation(), run_id="run-7", trace_id="run-7")
    agent = Agent(client, agent_id="clerk", tools=[lookup], middleware=[Tracing()])
    assert (await agent.run("where is order 7?", meta=meta)).output == "it shipped"

    found = {s.name: s for s in spans.get_finished_spans()}
    assert set(found) == {"invoke_agent clerk", "chat", "execute_tool lookup"}
    chats = [s for s in spans.get_finished_spans() if s.name == "chat"]
    assert len(chats) == 2
    trace_id = otel_trace_id("run-7")
    assert {s.context.trace_id for s in spans.get_finished_spans()} == {trace_id}
    turn = found["invoke_agent clerk"]
    assert turn.parent is not None
    assert turn.parent.span_id == otel_root_span_id("run-7")
    assert all(s.parent and s.parent.span_id == turn.context.span_id for s in chats)
    tool = found["execute_tool lookup"]
    assert tool.parent is not None
    assert tool.parent.span_id == turn.context.span_id
    assert tool.attributes is not None
    assert tool.attributes["gen_ai.tool.name"] == "lookup"
    first = chats[0].attributes or {}
    assert (first["gen_ai.usage.input_tokens"], first["gen_ai.usage.output_tokens"]) == (11, 3)
    assert (chats[1].attributes or {})["corral.cost_usd"] == 0.01
    assert first["corral.run.id"] == "run-7"
    # Never what the agent read or said: no argument, message or output is recorded.
    recorded = " ".join(
        str(v) for s in spans.get_finished_spans() for v in (s.attributes or {}).values()
    )
    assert "shipped" not in recorded
    assert "order 7" not in recorded


async def test_a_failed_tool_call_marks_its_span(spans: InMemorySpanExporter) -> None:  # noqa: F811
    def broken() -> str:
        raise ToolError("the index is down")

    client = ScriptedClient([call("broken"), text("sorry")])
    agent = Agent(client, agent_id="clerk", tools=[broken], middleware=[Tracing()])
    await agent.run("try it")
    (tool,) = [s for s in spans.get_finished_spans() if s.name == "execute_tool broken"]
    assert tool.status.status_code is StatusCode.ERROR


def test_corral_runs_without_opentelemetry() -> None:
    # In a process where OpenTelemetry cannot be imported, the library, the middleware and
    # the gateway import and run; the spans are simply not made. (The daemon's extra brings
    # the OpenTelemetry API anyway: the MCP SDK depends on it.)
    script = textwrap.dedent(
        """
        import asyncio, sys
        for name in list(sys.modules):
            if name.startswith("opentelemetry"):
                del sys.modules[name]
        sys.modules["opentelemetry"] = None
        from corral.agent import Agent
        from corral.runtime import ScriptedClient, Tracing
        from corral.runtime import _tracing
        import corral.gateway
        assert not _tracing.available() and not _tracing.enabled()
        agent = Agent(ScriptedClient(["done"]), middleware=[Tracing()])
        print(asyncio.run(agent.run("go")).output)
        """
    )
    ran = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert (ran.returncode, ran.stdout.strip()) == (0, "done"), ran.stderr


@pytest.mark.parametrize("trace_id", ["run-7", "4bf92f3577b34da6a3ce929d0e0e4736"])
async def test_spans_outside_a_run_join_the_run_s_trace(
    spans: InMemorySpanExporter,  # noqa: F811
    trace_id: str,
) -> None:
    from corral.runtime import _tracing

    with _tracing.span("outer", trace_id=trace_id), _tracing.span("inner", trace_id=trace_id):
        pass
    inner, outer = spans.get_finished_spans()
    assert inner.context.trace_id == outer.context.trace_id == otel_trace_id(trace_id)
    assert inner.parent is not None
    assert inner.parent.span_id == outer.context.span_id
