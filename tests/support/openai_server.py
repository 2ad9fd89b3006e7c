"""A real OpenAI-compatible HTTP server for tests, on 127.0.0.1 with an ephemeral port.

Standard library only: a ``ThreadingHTTPServer`` served from a daemon thread. Script the
replies, point a client at :attr:`OpenAIServer.base_url`, then inspect what it received::

    with OpenAIServer() as server:
        server.enqueue(completion("hello", usage=(12, 3)))
        server.enqueue(reply(status=429, body="slow down", headers={"Retry-After": "2"}))
        client = OpenAIClient(server.base_url, "test-model")
        ...
        assert server.requests[0].json["model"] == "test-model"

- ``POST /v1/chat/completions`` answers with the next scripted response, in order. An empty
  queue answers HTTP 500 with a body that says so, so a missing script is loud.
- Any other path or method answers 404 (and is recorded too).
- :func:`completion` and :func:`tool_call` build chat-completion bodies; :func:`reply` builds
  a raw response (any status, body bytes/str/JSON, headers, and a delay before answering).
- The :func:`openai_server` pytest fixture yields a started server and stops it afterwards;
  a ``conftest.py`` can re-export it with ``from tests.support.openai_server import
  openai_server``.

Stopping the server (leaving the ``with`` block) cuts every pending delay short.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

import pytest

__all__ = [
    "OpenAIServer",
    "RecordedRequest",
    "ScriptedResponse",
    "completion",
    "openai_server",
    "reply",
    "tool_call",
]

CHAT_PATH = "/v1/chat/completions"
_ids = itertools.count(1)


@dataclass(frozen=True, slots=True)
class ScriptedResponse:
    """One raw answer: status, body, headers, and seconds to wait before answering.

    A ``dict``/``list`` body is sent as JSON, a ``str`` as UTF-8 text, ``bytes`` as they are.
    """

    status: int = 200
    body: bytes | str | dict[str, Any] | list[Any] = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    delay_s: float = 0.0

    def encoded(self) -> tuple[bytes, str]:
        """The body bytes and their default content type."""
        if isinstance(self.body, bytes):
            return self.body, "application/octet-stream"
        if isinstance(self.body, str):
            return self.body.encode(), "text/plain; charset=utf-8"
        return json.dumps(self.body).encode(), "application/json"


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """A request the server received; ``headers`` keys are lower-case, ``json`` is None when
    the body is not JSON."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes
    json: Any


def tool_call(
    name: str, arguments: Mapping[str, Any] | str = "{}", *, id: str | None = None
) -> dict[str, Any]:
    """One entry of ``message.tool_calls``; a mapping is JSON-encoded, a str is sent as is."""
    raw = arguments if isinstance(arguments, str) else json.dumps(dict(arguments))
    return {
        "id": id if id is not None else f"call_{next(_ids)}",
        "type": "function",
        "function": {"name": name, "arguments": raw},
    }


def completion(
    text: str | None = None,
    *,
    tool_calls: Sequence[dict[str, Any]] = (),
    usage: tuple[int, int] | Mapping[str, Any] | None = (0, 0),
    model: str = "test-model",
    finish_reason: str | None = None,
) -> dict[str, Any]:
    """A chat-completion body with one choice.

    ``usage`` is ``(prompt_tokens, completion_tokens)``, a raw usage object, or None to leave
    it out. ``finish_reason`` defaults to ``"tool_calls"`` when there are tool calls, else
    ``"stop"``.
    """
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = list(tool_calls)
    if finish_reason is None:
        finish_reason = "tool_calls" if tool_calls else "stop"
    body: dict[str, Any] = {
        "id": f"chatcmpl-{next(_ids)}",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
    }
    if isinstance(usage, tuple):
        prompt, completion_tokens = usage
        body["usage"] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt + completion_tokens,
        }
    elif usage is not None:
        body["usage"] = dict(usage)
    return body


def reply(
    body: bytes | str | dict[str, Any] | list[Any] = b"",
    *,
    status: int = 200,
    headers: Mapping[str, str] | None = None,
    delay_s: float = 0.0,
) -> ScriptedResponse:
    """A raw scripted answer (errors, garbage bodies, slow replies)."""
    return ScriptedResponse(status=status, body=body, headers=dict(headers or {}), delay_s=delay_s)


class OpenAIServer:
    """A scripted OpenAI-compatible server; a context manager (``start``/``stop`` also work).

    Thread-safe: :meth:`enqueue` and :attr:`requests` may be used while requests are served.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: deque[ScriptedResponse] = deque()
        self._requests: list[RecordedRequest] = []
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> OpenAIServer:
        if self._httpd is not None:
            raise RuntimeError("OpenAIServer already started")
        httpd = _Server(("127.0.0.1", 0), _Handler)
        httpd.owner = self
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket. Idempotent."""
        httpd, thread = self._httpd, self._thread
        if httpd is None or thread is None:
            return
        self._stopping.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)
        self._thread = None

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- script and record -------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("OpenAIServer not started")
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1``: what an OpenAI client takes as its base URL."""
        return f"http://127.0.0.1:{self.port}/v1"

    def enqueue(self, *responses: ScriptedResponse | Mapping[str, Any]) -> None:
        """Add answers to the end of the queue; a mapping is a 200 JSON body."""
        items = [
            r if isinstance(r, ScriptedResponse) else ScriptedResponse(body=dict(r))
            for r in responses
        ]
        with self._lock:
            self._queue.extend(items)

    @property
    def pending(self) -> int:
        """How many scripted answers are still queued."""
        with self._lock:
            return len(self._queue)

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received so far, oldest first (a copy)."""
        with self._lock:
            return list(self._requests)

    # -- called by the handler thread --------------------------------------------------------

    def _answer(self, request: RecordedRequest) -> ScriptedResponse:
        with self._lock:
            self._requests.append(request)
            if request.method != "POST" or request.path != CHAT_PATH:
                return ScriptedResponse(
                    status=404, body={"error": {"message": f"no route {request.path}"}}
                )
            if not self._queue:
                return ScriptedResponse(
                    status=500,
                    body={"error": {"message": "OpenAIServer: no scripted response left"}},
                )
            return self._queue.popleft()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: OpenAIServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (timeout tests) leaves a broken pipe behind: not an error.
        return


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.0"

    def do_POST(self) -> None:
        self._serve()

    def do_GET(self) -> None:
        self._serve()

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            decoded: Any = json.loads(raw) if raw else None
        except ValueError:
            decoded = None
        request = RecordedRequest(
            method=self.command,
            path=self.path,
            headers={k.lower(): v for k, v in self.headers.items()},
            body=raw,
            json=decoded,
        )
        owner = self.server.owner
        answer = owner._answer(request)
        if answer.delay_s > 0 and owner._stopping.wait(answer.delay_s):
            return
        body, content_type = answer.encoded()
        self.send_response(answer.status)
        headers = {k.lower(): v for k, v in answer.headers.items()}
        self.send_header("Content-Type", headers.pop("content-type", content_type))
        self.send_header("Content-Length", str(len(body)))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return


@pytest.fixture
def openai_server() -> Iterator[OpenAIServer]:
    """A started :class:`OpenAIServer`, stopped after the test."""
    with OpenAIServer() as server:
        yield server
