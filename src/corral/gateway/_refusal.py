"""A refusal kept in an analysis cache: the ``GatewayError`` as data, raised again on a hit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from corral.gateway._errors import GatewayError

__all__ = ["Refusal"]


@dataclass(frozen=True, slots=True)
class Refusal:
    code: str
    message: str
    details: dict[str, Any]

    @classmethod
    def of(cls, error: GatewayError) -> Refusal:
        return cls(error.code, error.message, dict(error.details))

    def error(self) -> GatewayError:
        """A new ``GatewayError`` equal to the one kept."""
        return GatewayError(self.code, self.message, **self.details)
