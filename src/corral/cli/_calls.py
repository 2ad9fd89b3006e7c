"""How a command reaches the daemon, and how a refusal ends it (message and exit code).

Imports no typer, rich or httpx until a command runs: the package's ``__init__`` uses it.
"""

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, NoReturn, TypeVar

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


def call(target: Target, work: Callable[["HttpApi"], Awaitable[T]]) -> T:
    """Run ``work`` with a client of the daemon at ``target``; a refusal ends the command."""
    from corral.daemon._client import HttpApi

    async def run() -> T:
        async with HttpApi(target.url, token=target.token) as api:
            return await work(api)

    with refusals():
        return asyncio.run(run())
    raise AssertionError("unreachable")  # pragma: no cover - refusals exits
