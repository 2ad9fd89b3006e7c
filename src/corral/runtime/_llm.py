"""The model seam: ``LLMClient`` and the types a model call speaks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from corral.kernel import ChatMessage, CorralError, InvalidArgumentError, Role, ToolCall
from corral.kernel import _validate as v


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """Tokens one model call consumed."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    def __post_init__(self) -> None:
        v.non_negative_int("Usage", "prompt_tokens", self.prompt_tokens)
        v.non_negative_int("Usage", "completion_tokens", self.completion_tokens)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolSpec:
    """A tool as offered to a model: name, description and a JSON Schema for its arguments."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )

    def __post_init__(self) -> None:
        v.non_empty_str("ToolSpec", "name", self.name)
        v.instance_of("ToolSpec", "parameters", self.parameters, Mapping)


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatResult:
    """One model reply.

    ``cost_usd`` is None when the price of ``model`` is unknown; ``cached`` is True when a
    cache answered and no model was called (usage and cost are then zero).
    """

    message: ChatMessage
    usage: Usage = field(default_factory=Usage)
    cost_usd: float | None = None
    model: str | None = None
    finish_reason: str | None = None
    cached: bool = False

    def __post_init__(self) -> None:
        v.instance_of("ChatResult", "message", self.message, ChatMessage)
        if self.message.role is not Role.ASSISTANT:
            raise InvalidArgumentError(
                "ChatResult", "message.role", "assistant", self.message.role.value
            )
        v.non_negative_number("ChatResult", "cost_usd", self.cost_usd, optional=True)

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        return self.message.tool_calls

    @property
    def text(self) -> str | None:
        return self.message.content


@runtime_checkable
class LLMClient(Protocol):
    """Anything that turns a conversation into one assistant reply.

    Raises :class:`ModelError` subclasses; ``retryable`` on them says whether the same call
    may succeed later (rate limits, 5xx, connection failures).
    """

    async def generate(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[ToolSpec] | None = None,
        **options: Any,
    ) -> ChatResult: ...


class ModelError(CorralError):
    """A model call failed."""

    code = "model_error"


class ModelHTTPError(ModelError):
    """The model server answered with an HTTP error; 408, 429 and 5xx are retryable."""

    code = "model_http_error"

    def __init__(
        self, status_code: int, body: str, *, url: str, retry_after_s: float | None = None
    ) -> None:
        excerpt = body[:300]
        super().__init__(
            f"model server {url} answered HTTP {status_code}: {excerpt}",
            retryable=status_code in (408, 409, 429) or status_code >= 500,
            status_code=status_code,
            body=excerpt,
            url=url,
            retry_after_s=retry_after_s,
        )
        self.status_code = status_code
        self.retry_after_s = retry_after_s


class ModelUnavailableError(ModelError):
    """The model server could not be reached or did not answer in time (retryable)."""

    code = "model_unavailable"
    default_retryable = True

    def __init__(self, url: str, cause: str) -> None:
        super().__init__(f"model server {url} unavailable: {cause}", url=url, cause=cause)


class ModelResponseError(ModelError):
    """The model server answered 2xx with something that is not a valid chat completion."""

    code = "model_bad_response"

    def __init__(self, url: str, problem: str, body: str = "") -> None:
        super().__init__(
            f"model server {url} sent an invalid chat completion: {problem}",
            url=url,
            problem=problem,
            body=body[:300],
        )
