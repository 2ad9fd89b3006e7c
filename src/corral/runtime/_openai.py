"""``OpenAIClient``: the model seam over any OpenAI-compatible ``/chat/completions`` server."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from types import TracebackType
from typing import Any

import httpx

from corral.kernel import (
    SYSTEM_CLOCK,
    ChatMessage,
    Clock,
    InvalidArgumentError,
    Role,
    ToolCall,
    UsageError,
)
from corral.kernel import _validate as v
from corral.runtime._compaction import sequence_of
from corral.runtime._llm import (
    ChatResult,
    ModelHTTPError,
    ModelResponseError,
    ModelUnavailableError,
    ToolSpec,
    Usage,
)

# The request body is built here; options may add to it but never replace these.
_Bad = Callable[[str], ModelResponseError]
_RESERVED_OPTIONS = frozenset({"messages", "tools", "stream"})


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """What one model charges, in US dollars per million tokens (prompt and completion)."""

    input_per_mtok_usd: float
    output_per_mtok_usd: float

    def __post_init__(self) -> None:
        v.non_negative_number("ModelPrice", "input_per_mtok_usd", self.input_per_mtok_usd)
        v.non_negative_number("ModelPrice", "output_per_mtok_usd", self.output_per_mtok_usd)

    def cost(self, usage: Usage) -> float:
        """The dollar cost of ``usage`` at this price."""
        return (
            usage.prompt_tokens * self.input_per_mtok_usd
            + usage.completion_tokens * self.output_per_mtok_usd
        ) / 1_000_000


class OpenAIClient:
    """An :class:`~corral.runtime.LLMClient` for any OpenAI-compatible chat-completions server.

    ``base_url`` is the API root (``http://127.0.0.1:8000/v1``); each call is one
    ``POST {base_url}/chat/completions`` with ``model``, the messages, the tools (function
    form) and the merged ``default_options`` and per-call options (``temperature``,
    ``max_tokens``, ... passed through as body fields; a ``model`` option overrides the model
    for that call; ``messages``, ``tools`` and ``stream`` are refused). ``api_key`` is sent as
    a bearer token. ``timeout_s`` bounds connecting, writing, reading and pool waits, each.

    Results: the first choice's message, tool calls (arguments that are not a JSON object give
    a :class:`ToolCall` with empty ``arguments`` and the raw text in ``invalid_arguments``; an
    empty arguments string counts as ``{}``; a call without an id gets ``call_<n>``), the
    finish reason, the model the server names, and ``usage``. A reply without ``usage`` gets a
    zero :class:`Usage` and ``cost_usd=None`` (the cost is unknown). ``cost_usd`` comes from
    ``prices`` (model name -> :class:`ModelPrice`), looked up under the model the server
    names, then the model requested; a model without a price gives ``cost_usd=None``. There
    is no built-in price table: prices change.

    Raises :class:`ModelHTTPError` for an HTTP status outside 2xx (a ``Retry-After`` header in
    seconds or as an HTTP date becomes ``retry_after_s``), :class:`ModelUnavailableError` when
    the server cannot be reached or does not answer within ``timeout_s``, and
    :class:`ModelResponseError` for a 2xx body that is not a chat completion. Bad arguments
    raise :class:`InvalidArgumentError`; a call after :meth:`aclose` raises
    :class:`UsageError`.

    Give either ``http_client`` (yours; never closed here) or ``transport`` (for the client
    created here), not both. Use ``async with`` or call :meth:`aclose` (idempotent).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        prices: Mapping[str, ModelPrice] | None = None,
        timeout_s: float = 60.0,
        http_client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        default_options: Mapping[str, Any] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        where = "OpenAIClient"
        v.non_empty_str(where, "base_url", base_url)
        if not base_url.startswith(("http://", "https://")):
            raise InvalidArgumentError(where, "base_url", "an http:// or https:// URL", base_url)
        try:
            parsed = httpx.URL(base_url)
            usable = bool(parsed.host) and (parsed.port is None or 0 < parsed.port < 65536)
        except (httpx.InvalidURL, ValueError, TypeError):
            usable = False
        if not usable:
            raise InvalidArgumentError(where, "base_url", "a valid URL with a host", base_url)
        v.non_empty_str(where, "model", model)
        v.non_empty_str(where, "api_key", api_key, optional=True)
        price_table = {} if prices is None else prices
        v.instance_of(where, "prices", price_table, Mapping)
        for name, price in price_table.items():
            v.non_empty_str(where, "prices key", name)
            v.instance_of(where, f"prices[{name!r}]", price, ModelPrice)
        v.positive_number(where, "timeout_s", timeout_s)
        if http_client is not None:
            v.instance_of(where, "http_client", http_client, httpx.AsyncClient)
        if transport is not None:
            v.instance_of(where, "transport", transport, httpx.AsyncBaseTransport)
            if http_client is not None:
                raise InvalidArgumentError(
                    where, "transport", "None when http_client is given", transport
                )
        defaults = {} if default_options is None else default_options
        v.instance_of(where, "default_options", defaults, Mapping)
        _check_options(where, "default_options", defaults)
        v.instance_of(where, "clock", clock, Clock)

        self._url = base_url.rstrip("/") + "/chat/completions"
        self._base_url = base_url.rstrip("/")
        self._model = model
        self._api_key = api_key
        self._prices: dict[str, ModelPrice] = dict(price_table)
        self._timeout = httpx.Timeout(timeout_s)
        self._defaults: dict[str, Any] = dict(defaults)
        self._clock = clock
        self._owns_client = http_client is None
        self._client = (
            http_client
            if http_client is not None
            else httpx.AsyncClient(transport=transport, timeout=self._timeout)
        )
        self._closed = False

    @property
    def base_url(self) -> str:
        return self._base_url

    @property
    def model(self) -> str:
        return self._model

    @property
    def prices(self) -> Mapping[str, ModelPrice]:
        return dict(self._prices)

    async def __aenter__(self) -> OpenAIClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP client if this object created it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owns_client:
            await self._client.aclose()

    def __repr__(self) -> str:
        return f"OpenAIClient(base_url={self._base_url!r}, model={self._model!r})"

    async def generate(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[ToolSpec] | None = None,
        **options: Any,
    ) -> ChatResult:
        """One chat completion; see the class docstring for what is sent and what raises."""
        where = "OpenAIClient.generate"
        if self._closed:
            raise UsageError(f"{self!r} is closed; create a new client to call the model")
        body = self._request_body(where, messages, tools, options)
        try:
            payload = json.dumps(body, default=_json_default).encode()
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(
                where, "messages, tools and options", "JSON-serialisable values", str(exc)
            ) from None
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key is not None:
            headers["Authorization"] = f"Bearer {self._api_key}"
        try:
            response = await self._client.post(
                self._url, content=payload, headers=headers, timeout=self._timeout
            )
        except httpx.TimeoutException as exc:
            cause = f"no answer within {self._timeout.read:g} s ({type(exc).__name__})"
            raise ModelUnavailableError(self._url, cause) from exc
        except httpx.DecodingError as exc:
            raise ModelResponseError(self._url, f"undecodable body: {exc}") from exc
        except httpx.RequestError as exc:
            cause = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise ModelUnavailableError(self._url, cause) from exc
        if not 200 <= response.status_code < 300:
            raise ModelHTTPError(
                response.status_code,
                response.text,
                url=self._url,
                retry_after_s=self._retry_after(response.headers.get("retry-after")),
            )
        return self._parse(response, requested_model=str(body["model"]))

    def _request_body(
        self,
        where: str,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec] | None,
        options: Mapping[str, Any],
    ) -> dict[str, Any]:
        checked = sequence_of(where, "messages", messages, ChatMessage)
        if not checked:
            raise InvalidArgumentError(where, "messages", "at least one ChatMessage", messages)
        _check_options(where, "options", options)
        body: dict[str, Any] = {"model": self._model, **self._defaults, **options}
        v.non_empty_str(where, "model option", body["model"])
        body["messages"] = [_encode_message(m) for m in checked]
        if tools is not None:
            specs = sequence_of(where, "tools", tools, ToolSpec)
            if specs:
                body["tools"] = [_encode_tool(t) for t in specs]
        return body

    def _retry_after(self, header: str | None) -> float | None:
        if header is None:
            return None
        text = header.strip()
        try:
            seconds = float(text)
        except ValueError:
            try:
                when = parsedate_to_datetime(text)
            except (TypeError, ValueError, IndexError):
                return None
            if when.utcoffset() is None:
                return None
            seconds = (when - self._clock.now()).total_seconds()
            return max(0.0, seconds)
        return seconds if math.isfinite(seconds) and seconds >= 0 else None

    def _parse(self, response: httpx.Response, *, requested_model: str) -> ChatResult:
        url = self._url
        raw = response.text
        try:
            data = json.loads(response.content)
        except (ValueError, UnicodeDecodeError):
            raise ModelResponseError(url, "the body is not JSON", raw) from None

        def bad(problem: str) -> ModelResponseError:
            return ModelResponseError(url, problem, raw)

        if not isinstance(data, dict):
            raise bad(f"the body is a JSON {type(data).__name__}, not an object")
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices:
            raise bad("'choices' is missing, empty or not a list")
        choice = choices[0]
        if not isinstance(choice, dict):
            raise bad("choices[0] is not an object")
        message = choice.get("message")
        if not isinstance(message, dict):
            raise bad("choices[0].message is missing or not an object")
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            raise bad("choices[0].message.content is not a string or null")
        calls = _parse_tool_calls(message.get("tool_calls"), bad)
        finish_reason = choice.get("finish_reason")
        if finish_reason is not None and not isinstance(finish_reason, str):
            raise bad("choices[0].finish_reason is not a string or null")
        model = data.get("model")
        if model is not None and not isinstance(model, str):
            raise bad("'model' is not a string")
        usage = _parse_usage(data.get("usage"), bad)
        cost: float | None = None
        if usage is not None:
            price = self._prices.get(model) if model else None
            if price is None:
                price = self._prices.get(requested_model)
            cost = price.cost(usage) if price is not None else None
        return ChatResult(
            message=ChatMessage(Role.ASSISTANT, content, calls),
            usage=usage if usage is not None else Usage(),
            cost_usd=cost,
            model=model or requested_model,
            finish_reason=finish_reason,
        )


def _check_options(where: str, name: str, options: Mapping[str, Any]) -> None:
    for key in options:
        if not isinstance(key, str):
            raise InvalidArgumentError(where, f"{name} key", "a string", key)
        if key in _RESERVED_OPTIONS:
            raise InvalidArgumentError(
                where, f"{name}[{key!r}]", "absent (messages, tools and stream are built here)", key
            )


def _json_default(value: object) -> object:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, set | frozenset):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _encode_message(message: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role.value}
    if message.role is Role.ASSISTANT:
        # An assistant turn that only calls tools has null content in the OpenAI format.
        out["content"] = message.content
        if message.tool_calls:
            out["tool_calls"] = [_encode_call(call) for call in message.tool_calls]
    else:
        out["content"] = message.content if message.content is not None else ""
    if message.role is Role.TOOL:
        out["tool_call_id"] = message.tool_call_id
    elif message.name is not None:
        out["name"] = message.name
    return out


def _encode_call(call: ToolCall) -> dict[str, Any]:
    # Send back what the model said, even when it was not a JSON object.
    arguments = (
        call.invalid_arguments
        if call.invalid_arguments is not None
        else json.dumps(call.arguments, default=_json_default)
    )
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": arguments},
    }


def _encode_tool(tool: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    }


def _parse_tool_calls(raw: Any, bad: _Bad) -> tuple[ToolCall, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise bad("choices[0].message.tool_calls is not a list")
    calls: list[ToolCall] = []
    for index, item in enumerate(raw):
        where = f"choices[0].message.tool_calls[{index}]"
        if not isinstance(item, dict):
            raise bad(f"{where} is not an object")
        call_id = item.get("id")
        if call_id is None or call_id == "":
            call_id = f"call_{index}"
        if not isinstance(call_id, str) or not call_id.strip():
            raise bad(f"{where}.id is not a non-empty string")
        function = item.get("function")
        if not isinstance(function, dict):
            raise bad(f"{where}.function is missing or not an object")
        name = function.get("name")
        if not isinstance(name, str) or not name.strip():
            raise bad(f"{where}.function.name is missing or not a non-empty string")
        arguments = function.get("arguments")
        if isinstance(arguments, dict):
            calls.append(ToolCall(call_id, name, arguments))
        elif arguments is None or (isinstance(arguments, str) and not arguments.strip()):
            calls.append(ToolCall(call_id, name, {}))
        elif isinstance(arguments, str):
            try:
                decoded = json.loads(arguments)
            except ValueError:
                decoded = None
            if isinstance(decoded, dict):
                calls.append(ToolCall(call_id, name, decoded))
            else:
                calls.append(ToolCall(call_id, name, {}, invalid_arguments=arguments))
        else:
            raise bad(f"{where}.function.arguments is not a string or an object")
    return tuple(calls)


def _parse_usage(raw: Any, bad: _Bad) -> Usage | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise bad("'usage' is not an object")
    counts: dict[str, int] = {}
    for key in ("prompt_tokens", "completion_tokens"):
        value = raw.get(key, 0)
        if value is None:
            value = 0
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise bad(f"usage.{key} is not a non-negative integer")
        counts[key] = value
    return Usage(**counts)
