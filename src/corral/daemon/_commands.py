"""Idempotent commands: an idempotency key gives back the answer first recorded under it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from corral.daemon import _events as ev
from corral.daemon._errors import IdempotencyConflictError
from corral.daemon._events import NewEvent
from corral.daemon._state import State
from corral.kernel import _validate as v


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What a command answered; ``replayed`` when an idempotency key returned a stored answer."""

    status: int
    body: dict[str, Any]
    replayed: bool = False


def replayed(state: State, key: str | None, command: dict[str, Any]) -> CommandResult | None:
    """The answer recorded under ``key``, or None when there is none (or no key).

    Raises :class:`IdempotencyConflictError` when the key was used for another command.
    """
    if key is None:
        return None
    v.non_empty_str("command", "idempotencyKey", key)
    stored = state.commands.get(key)
    if stored is None:
        return None
    if stored["fingerprint"] != _fingerprint(command):
        first = stored["command"]
        differs = None
        if _describe(first) == _describe(command):
            differs = _differing(first, command)
        raise IdempotencyConflictError(key, _describe(first), _describe(command), differs)
    return CommandResult(stored["status"], stored["response"], replayed=True)


def recorded(key: str, command: dict[str, Any], result: CommandResult) -> NewEvent:
    """The event that keeps ``result`` under ``key``, committed with the command's events."""
    return ev.command_recorded(key, _fingerprint(command), command, result.status, result.body)


def _fingerprint(command: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(command, sort_keys=True).encode()).hexdigest()


def _differing(first: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """The arguments that differ between two commands of one kind (a spawn's spec field by
    field), as dotted names."""
    found = []
    for name in sorted(set(first) | set(now)):
        was, new = first.get(name), now.get(name)
        if was == new:
            continue
        if isinstance(was, dict) and isinstance(new, dict):
            found += [
                f"{name}.{k}" for k in sorted(set(was) | set(new)) if was.get(k) != new.get(k)
            ]
        else:
            found.append(name)
    return found


def _describe(command: dict[str, Any]) -> str:
    name = command.get("command", "?")
    agent = command.get("agent")
    return f"{name} of agent {agent!r}" if agent else f"{name}"
