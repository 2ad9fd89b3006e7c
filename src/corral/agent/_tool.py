"""``Tool``: a Python callable offered to a model, with arguments validated before it runs."""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable, Mapping
from typing import Any, get_type_hints, overload

import pydantic

from corral.kernel import CorralError, InvalidArgumentError
from corral.kernel import _validate as v
from corral.runtime import ToolSpec

ToolFunction = Callable[..., Any]


class ToolError(CorralError):
    """A tool call could not produce a result; the agent reports it to the model."""

    code = "tool_error"


class UnknownToolError(ToolError):
    code = "unknown_tool"

    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(
            f"the model asked for tool {name!r}, which does not exist; tools: {known}",
            tool=name,
            known=known,
        )


class ToolArgumentsError(ToolError):
    code = "tool_arguments_invalid"

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"arguments for tool {name!r} are invalid: {problem}", tool=name)


class ToolFailedError(ToolError):
    """The tool itself raised; ``__cause__`` is what it raised."""

    code = "tool_failed"

    def __init__(self, name: str, error: BaseException) -> None:
        super().__init__(
            f"tool {name!r} raised {type(error).__name__}: {error}",
            tool=name,
            error_type=type(error).__name__,
        )


class Tool:
    """A callable the model may call.

    The JSON Schema offered to the model is derived from the function's signature and type
    hints (pydantic); arguments from the model are validated against it before the function
    runs. Any parameter name works (``schema``, ``_private``, ...), and positional-only
    parameters are passed by position. Coroutine functions (and objects with an async
    ``__call__``) are awaited; plain functions run in a worker thread so a blocking tool does
    not stall the event loop (a cancelled run abandons, but cannot interrupt, such a thread);
    a plain function that returns an awaitable has it awaited on the loop. The result is
    returned to the model as text: strings as they are, anything else as JSON. A function
    that raises a :class:`ToolError` (a subclass of its own, say) has it passed on as it is,
    so its message is what the model is told; anything else it raises becomes a
    :class:`ToolFailedError`.

    :meth:`from_schema` makes a tool whose JSON Schema is given rather than derived (a tool
    described in data, such as a command of an agent spec).
    """

    __slots__ = ("_adapter", "_fn", "_is_async", "_params", "description", "name", "spec")

    def __init__(
        self,
        fn: ToolFunction,
        *,
        name: str | None = None,
        description: str | None = None,
    ) -> None:
        v.callable_("Tool", "fn", fn)
        self._fn = fn
        self.name = name if name is not None else getattr(fn, "__name__", "")
        v.non_empty_str("Tool", "name", self.name)
        doc = inspect.getdoc(fn) or ""
        self.description = description if description is not None else doc.split("\n\n")[0]
        # an object whose __call__ is async counts as a coroutine function too
        self._is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            type(fn).__call__
        )
        adapter, self._params = _arguments_model(fn, self.name)
        self._adapter: type[pydantic.BaseModel] | None = adapter
        schema = adapter.model_json_schema()
        schema.pop("title", None)
        self.spec = ToolSpec(name=self.name, description=self.description, parameters=schema)

    @classmethod
    def from_schema(
        cls,
        fn: Callable[[dict[str, Any]], Any],
        *,
        name: str,
        parameters: Mapping[str, Any],
        description: str = "",
    ) -> Tool:
        """A tool offered to the model with ``parameters`` as its JSON Schema.

        ``fn`` takes one argument: the model's arguments, a fresh ``dict`` (a JSON object),
        and is awaited or run in a worker thread as the functions of :class:`Tool` are.
        The arguments are not checked against ``parameters`` (they are only required to be
        an object): ``fn`` checks what it relies on, raising :class:`ToolError` (or a
        subclass) to tell the model what is wrong. ``parameters`` must be a JSON Schema
        object whose ``type`` is ``"object"`` and that JSON can encode; it is copied.

        Raises ``InvalidArgumentError`` when ``fn`` is not callable, ``name`` is empty,
        ``description`` is not a string or ``parameters`` is not such an object.
        """
        where = "Tool.from_schema"
        v.callable_(where, "fn", fn)
        v.non_empty_str(where, "name", name)
        v.instance_of(where, "description", description, str)
        if not isinstance(parameters, Mapping) or parameters.get("type") != "object":
            raise InvalidArgumentError(
                where, "parameters", 'a JSON Schema object with "type": "object"', parameters
            )
        try:
            schema = json.loads(json.dumps(parameters, allow_nan=False))
        except (TypeError, ValueError, RecursionError) as exc:
            raise InvalidArgumentError(
                where, "parameters", f"a JSON Schema that JSON can encode ({exc})", parameters
            ) from None
        self = cls.__new__(cls)
        self._fn = fn
        self.name = name
        self.description = description
        self._is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            type(fn).__call__
        )
        self._adapter = None
        self._params = ()
        self.spec = ToolSpec(name=name, description=description, parameters=schema)
        return self

    async def call(self, arguments: Mapping[str, Any]) -> str:
        """Validate ``arguments`` and run the tool.

        Raises ToolArgumentsError for invalid arguments and ToolFailedError when the tool
        raises (a ToolError it raises and ``asyncio.CancelledError`` pass through);
        InvalidArgumentError when ``arguments`` is not a mapping.
        """
        v.instance_of("Tool.call", "arguments", arguments, Mapping)
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        if self._adapter is None:
            args.append(dict(arguments))  # a schema tool: fn checks its own arguments
        else:
            try:
                parsed = self._adapter.model_validate(dict(arguments))
            except pydantic.ValidationError as exc:
                problems = "; ".join(
                    f"{'.'.join(str(p) for p in e['loc']) or '(arguments)'}: {e['msg']}"
                    for e in exc.errors()
                )
                raise ToolArgumentsError(self.name, problems) from None
            for field_name, param_name, positional in self._params:
                value = getattr(parsed, field_name)
                if positional:
                    args.append(value)
                else:
                    kwargs[param_name] = value
        try:
            if self._is_async:
                result = await self._fn(*args, **kwargs)
            else:
                result = await asyncio.to_thread(self._fn, *args, **kwargs)
                if inspect.isawaitable(result):
                    result = await result
        except ToolError:
            raise  # the tool's own account of what went wrong
        except Exception as exc:
            raise ToolFailedError(self.name, exc) from exc
        return _as_text(result)

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"


@overload
def tool(fn: ToolFunction, *, name: str | None = None, description: str | None = None) -> Tool: ...


@overload
def tool(
    fn: None = None, *, name: str | None = None, description: str | None = None
) -> Callable[[ToolFunction], Tool]: ...


def tool(
    fn: ToolFunction | None = None, *, name: str | None = None, description: str | None = None
) -> Tool | Callable[[ToolFunction], Tool]:
    """Decorator form of :class:`Tool`: ``@tool`` or ``@tool(name=..., description=...)``."""

    def wrap(f: ToolFunction) -> Tool:
        return Tool(f, name=name, description=description)

    return wrap if fn is None else wrap(fn)


def _arguments_model(
    fn: ToolFunction, name: str
) -> tuple[type[pydantic.BaseModel], tuple[tuple[str, str, bool], ...]]:
    """The arguments model of ``fn`` and, per parameter, (field, parameter, positional-only).

    Fields get neutral names and the parameter names as aliases, so a parameter may be named
    like a pydantic attribute (``schema``, ``model_config``) or start with an underscore.
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        raise InvalidArgumentError(
            "Tool", "fn", "a callable with an inspectable signature", fn
        ) from None
    try:
        hints = get_type_hints(fn)
    except Exception:  # unresolvable forward references: fall back to Any
        hints = {}
    fields: dict[str, Any] = {}
    params: list[tuple[str, str, bool]] = []
    for index, param in enumerate(signature.parameters.values()):
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise InvalidArgumentError(
                "Tool", "fn", "a function without *args or **kwargs", param.name
            )
        annotation = hints.get(param.name, Any)
        default = ... if param.default is inspect.Parameter.empty else param.default
        field_name = f"p{index}"
        fields[field_name] = (annotation, pydantic.Field(default, alias=param.name))
        params.append((field_name, param.name, param.kind is param.POSITIONAL_ONLY))
    config = pydantic.ConfigDict(extra="forbid")
    try:
        model = pydantic.create_model(f"{name}_arguments", __config__=config, **fields)
        model.model_json_schema()
    except pydantic.PydanticUserError as exc:
        raise InvalidArgumentError(
            "Tool", "fn", f"parameters pydantic can describe ({exc})", fn
        ) from None
    return model, tuple(params)


def _as_text(result: Any) -> str:
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result, default=str)
    except (TypeError, ValueError):
        return str(result)
