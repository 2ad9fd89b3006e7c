"""A no-op agent function for the python harness, used by the daemon benchmark."""

from __future__ import annotations

from typing import Any


async def turn(prompt: str, context: Any) -> str:
    return "ok"
