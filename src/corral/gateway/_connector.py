"""What a gateway's ``connect`` returns: ``async with`` it (closes on exit) or await it."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Generic, Protocol, TypeVar


class _Openable(Protocol):
    async def open(self) -> None: ...

    async def close(self) -> None: ...


G = TypeVar("G", bound=_Openable)


class Connector(Generic[G]):
    """Opens its gateway when awaited or entered; ``async with`` also closes it on exit."""

    def __init__(self, gateway: G) -> None:
        self._gateway = gateway

    def __await__(self) -> Generator[Any, None, G]:
        return self._open().__await__()

    async def _open(self) -> G:
        await self._gateway.open()
        return self._gateway

    async def __aenter__(self) -> G:
        return await self._open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self._gateway.close()
