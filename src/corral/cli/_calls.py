"""How a command reaches the daemon, and how a refusal ends it (message and exit code).

Imports no typer, rich or httpx until a command runs: the package's ``__init__`` uses it. A
command that asks and prints the answer runs without an event loop, on the blocking wire
(``http.client``): it imports neither asyncio nor httpx, a third of a second of a command's
start on a small machine. Streams and waits that sleep run on asyncio and httpx (``loop``).
"""

from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar, cast

from corral.cli._exits import exit_code
from corral.cli._output import say
from corral.kernel import CorralError

if TYPE_CHECKING:
    from corral.daemon._client import HttpApi

DEFAULT_URL = "http://127.0.0.1:4600"

T = TypeVar("T")


class Target:
    """The daemon the global options point at: ``--url`` and ``--token`` (``given``: the
    option, else ``CORRAL_TOKEN``)."""

    __slots__ = ("given", "url")

    def __init__(self, url: str, token: str | None) -> None:
        self.url = url
        self.given = token

    @property
    def token(self) -> str | None:
        """The token to send: ``--token``, else ``CORRAL_TOKEN``, else the local daemon's
        token file (``$CORRAL_HOME/token``, default ``.corral/token``), and that file only
        to a loopback URL: a local secret never leaves the machine. Raises
        ``TokenFileError`` for a file readable by others (it is not sent)."""
        if self.given:
            return self.given
        from urllib.parse import urlsplit

        from corral.daemon._auth import is_loopback_host
        from corral.daemon._token_file import read_token_file, token_path

        try:
            host = urlsplit(self.url).hostname
        except ValueError:
            return None
        if host is None or not is_loopback_host(host):
            return None
        return read_token_file(token_path())


_errors_as_json = False


def errors_as_json(on: bool) -> None:
    """``--json`` was given: a refusal is printed as JSON (on stderr) too."""
    global _errors_as_json
    _errors_as_json = on


def fail(error: CorralError) -> NoReturn:
    """Print ``error <code>: <message>`` on stderr (with --json, the daemon's error body
    ``{"error": {code, message, retryable, details}}``) and exit with ``exit_code(error)``."""
    import typer

    if _errors_as_json:
        import json
        import sys

        print(json.dumps({"error": error.to_dict()}, default=str), file=sys.stderr, flush=True)
    else:
        say(f"error {error.code}: {error.message}", err=True)
    raise typer.Exit(exit_code(error))


@contextmanager
def refusals() -> Iterator[None]:
    """A ``CorralError`` raised inside ends the command through ``fail``."""
    try:
        yield
    except CorralError as exc:
        fail(exc)


def call(target: Target, work: Callable[["HttpApi"], Awaitable[T]], *, loop: bool = False) -> T:
    """Run ``work`` with a client of the daemon at ``target``; a refusal ends the command.

    ``work`` runs without an event loop, its requests blocking over ``http.client``, unless
    ``loop``: then on asyncio, over httpx, for work that streams (server-sent events) or
    sleeps between requests.
    """
    from corral.daemon._client import HttpApi

    async def run(blocking: bool) -> T:
        async with HttpApi(target.url, token=target.token, blocking=blocking) as api:
            return await work(api)

    with refusals():
        if loop:
            import asyncio

            return asyncio.run(run(False))
        return drive(run(True))
    raise AssertionError("unreachable")  # pragma: no cover - refusals exits


def drive(coroutine: Coroutine[Any, Any, T]) -> T:
    """The result of ``coroutine``, run to its end without an event loop: it must never
    suspend (its only awaits are the blocking wire's requests). One that does is a bug of
    the command (it needs ``loop=True``) and raises ``RuntimeError``."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    coroutine.close()
    raise RuntimeError("a command's work suspended without an event loop (it needs loop=True)")
