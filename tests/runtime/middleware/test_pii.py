import re
from typing import Any

import pytest

from corral.kernel import ChatMessage, InvalidArgumentError, MiddlewareStage, RunMeta, ToolCall
from corral.runtime import (
    Cancellation,
    FakeClock,
    MiddlewareContext,
    MiddlewarePipeline,
    PIIRedaction,
)


def make_meta() -> RunMeta:
    clock = FakeClock()
    return RunMeta(cancellation=Cancellation(clock=clock), clock=clock)


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("write to bob.smith+tag@example.co.uk today", "email"),
        ("card 4111 1111 1111 1111 please", "credit_card"),
        ("card 4111-1111-1111-1111 please", "credit_card"),
        ("card 5500005555555559 please", "credit_card"),
        ("amex 3782 822463 10005 please", "credit_card"),
        ("ssn 123-45-6789 on file", "ssn"),
        ("host 192.168.1.10. is up", "ipv4"),
        ("call +1 555 123 4567 now", "phone"),
        ("call (555) 123-4567 now", "phone"),
        ("call 555-123-4567 now", "phone"),
        ("call +44 20 7946 0958 now", "phone"),
    ],
)
def test_each_kind_is_found(text: str, kind: str) -> None:
    redacted, counts = PIIRedaction().redact(text)
    assert counts == {kind: 1}
    assert f"[REDACTED:{kind}]" in redacted
    assert redacted.split()[0] == text.split()[0]  # the rest of the text stays


@pytest.mark.parametrize(
    "text",
    [
        "card 4111 1111 1111 1112 fails Luhn",
        "order 1234567890123 is not a card",
        "mixed separators 4111-1111 1111-1111",
        "zeros 0000 0000 0000 0000",
        "ssn-like 000-12-3456 666-12-3456 900-12-3456 123-00-4567 123-45-0000",
        "not an address 999.1.1.1 or 1.2.3 or 10.0.0.1.5",
        "bare digits 5551234567 stay, so do 12:30 and 2024-01-15 and 1,234.56",
        "no domain user@localhost",
    ],
)
def test_lookalikes_are_left_alone(text: str) -> None:
    assert PIIRedaction().redact(text) == (text, {})


@pytest.mark.parametrize(
    ("number", "luhn_valid"),
    [
        ("4111111111111111", True),
        ("378282246310005", True),
        ("4111111111111112", False),
        ("1234567890123", False),
    ],
)
def test_a_card_number_is_redacted_only_when_its_luhn_checksum_holds(
    number: str, luhn_valid: bool
) -> None:
    redacted, counts = PIIRedaction(kinds=["credit_card"]).redact(f"card {number} here")
    if luhn_valid:
        assert redacted == "card [REDACTED:credit_card] here"
        assert counts == {"credit_card": 1}
    else:
        assert redacted == f"card {number} here"
        assert counts == {}


def test_counts_add_up_per_kind() -> None:
    text = "a@x.io, b@y.io and 10.0.0.1; 123-45-6789"
    redacted, counts = PIIRedaction().redact(text)
    assert counts == {"email": 2, "ipv4": 1, "ssn": 1}
    assert redacted == ("[REDACTED:email], [REDACTED:email] and [REDACTED:ipv4]; [REDACTED:ssn]")


def test_kinds_extra_patterns_and_replacement() -> None:
    pii = PIIRedaction(
        kinds=["email"], extra_patterns={"employee": r"EMP-\d{6}"}, replacement="<{kind}>"
    )
    assert pii.kinds == ("email", "employee")
    text = "EMP-123456 (a@b.io) called 555-123-4567"
    assert pii.redact(text) == (
        "<employee> (<email>) called 555-123-4567",
        {"email": 1, "employee": 1},
    )
    fixed = PIIRedaction(
        kinds=(), extra_patterns={"key": re.compile("sk-[a-z]+")}, replacement="***"
    )
    assert fixed.redact("use sk-abc now") == ("use *** now", {"key": 1})


async def test_chat_sends_redacted_copies_and_never_touches_the_callers_messages() -> None:
    call = ToolCall(
        id="c1", name="mail", arguments={"to": "eve@corp.com", "n": 3, "cc": ["x@y.io"]}
    )
    messages = [
        ChatMessage.system("be nice"),
        ChatMessage.user("my card is 4111 1111 1111 1111, mail me at amy@example.com"),
        ChatMessage.assistant(None, (call,)),
        ChatMessage.tool("c1", "sent"),
    ]
    snapshot = list(messages)
    ctx = MiddlewareContext.chat("a", make_meta(), messages)
    caller_list = ctx.messages
    sent: list[list[ChatMessage]] = []

    async def model(ctx: MiddlewareContext) -> None:
        sent.append(ctx.messages)

    await MiddlewarePipeline([PIIRedaction()]).run(ctx, model)
    assert caller_list == snapshot
    assert messages == snapshot
    out = sent[0]
    assert out is not caller_list
    assert out[0] is messages[0]
    assert out[3] is messages[3]
    assert out[1].content == "my card is [REDACTED:credit_card], mail me at [REDACTED:email]"
    assert out[2].tool_calls[0].arguments == {
        "to": "[REDACTED:email]",
        "n": 3,
        "cc": ["[REDACTED:email]"],
    }
    assert call.arguments["to"] == "eve@corp.com"
    assert ctx.metadata["pii_redactions"] == {"credit_card": 1, "email": 3}


async def test_chat_without_pii_keeps_the_same_list() -> None:
    messages = [ChatMessage.user("nothing to see")]
    ctx = MiddlewareContext.chat("a", make_meta(), messages)
    original = ctx.messages
    await MiddlewarePipeline([PIIRedaction()]).run(ctx, _noop)
    assert ctx.messages is original
    assert "pii_redactions" not in ctx.metadata


async def test_tool_output_is_redacted_after_the_call_and_counts_accumulate() -> None:
    ctx = MiddlewareContext.tool("a", make_meta(), "lookup", {"email": "amy@example.com"})
    ctx.metadata["pii_redactions"] = {"email": 1}
    seen: list[dict[str, Any]] = []

    async def tool(ctx: MiddlewareContext) -> None:
        seen.append(dict(ctx.arguments))
        ctx.result = "amy@example.com lives at 10.1.2.3"

    result = await MiddlewarePipeline([PIIRedaction()]).run(ctx, tool)
    assert seen == [{"email": "amy@example.com"}]  # the tool got the real arguments
    assert result == "[REDACTED:email] lives at [REDACTED:ipv4]"
    assert ctx.metadata["pii_redactions"] == {"email": 2, "ipv4": 1}


async def test_non_text_tool_results_are_left_alone() -> None:
    ctx = MiddlewareContext.tool("a", make_meta(), "count")

    async def tool(ctx: MiddlewareContext) -> None:
        ctx.result = 42

    assert await MiddlewarePipeline([PIIRedaction()]).run(ctx, tool) == 42


def test_runs_at_chat_and_tool_only() -> None:
    pii = PIIRedaction()
    pipeline = MiddlewarePipeline([pii])
    assert pipeline.for_stage(MiddlewareStage.TURN) == ()
    assert pipeline.for_stage(MiddlewareStage.CHAT) == (pii,)
    assert pipeline.for_stage(MiddlewareStage.TOOL) == (pii,)


async def _noop(ctx: MiddlewareContext) -> None:
    ctx.result = None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kinds": ["email", "passport"]}, r"kinds\[\] must be one of email, credit_card"),
        ({"kinds": "email"}, "kinds must be an iterable of kind names"),
        ({"kinds": 5}, "kinds must be an iterable of kind names"),
        ({"kinds": []}, "kinds must be at least one kind or extra pattern"),
        ({"replacement": 0}, "replacement must be a string"),
        (
            {"replacement": "[{who}]"},
            r"replacement must be a string whose only format field is \{kind\}",
        ),
        (
            {"replacement": "[{0}]"},
            r"replacement must be a string whose only format field is \{kind\}",
        ),
        ({"extra_patterns": ["x"]}, "extra_patterns must be a mapping"),
        (
            {"extra_patterns": {"id": "("}},
            r"extra_patterns\['id'\] must be a valid regular expression",
        ),
        ({"extra_patterns": {"id": "x*"}}, "cannot match the empty string"),
        ({"extra_patterns": {"id": 5}}, "must be a str regular expression"),
        ({"extra_patterns": {"id": re.compile(b"x")}}, "must be a str regular expression"),
        ({"extra_patterns": {"": "x"}}, "extra_patterns key must be a non-empty string"),
        ({"extra_patterns": {"email": "x"}}, "a name other than the chosen built-in kinds"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        PIIRedaction(**kwargs)
