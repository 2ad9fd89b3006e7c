"""The client's errors: what the daemon refused (its code, message and retryable flag), a
daemon nobody reaches, and a connection that cannot be made for want of settings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from corral.kernel import CorralError, UsageError


class DaemonRefusedError(CorralError):
    """The daemon refused a request. ``code``, ``message``, ``retryable`` and ``details``
    are the daemon's own (``agent_busy``, ``budget_exhausted``, ``out_of_scope``, ...: see
    docs/daemon.md, "The HTTP API"); ``status`` is the HTTP status of its answer."""

    code = "daemon_refused"

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: int,
        retryable: bool = False,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message, retryable=retryable, **dict(details or {}))
        # The code is the daemon's, per instance; the class's only names the family.
        object.__setattr__(self, "code", code)
        self.status = status


class TurnRefusedError(DaemonRefusedError):
    """The daemon refused to begin a turn: the agent is in a turn already (``agent_busy``,
    retryable), held waiting on a person (``agent_held``), stopped or failed
    (``agent_not_live``), paused (``agent_paused``, retryable), or its budget -- or an
    ancestor's -- has no room left (``budget_exhausted``)."""

    code = "turn_refused"


class DaemonUnreachableError(CorralError):
    """No daemon answers at ``url`` (refused, unresolvable, timed out, dropped), for as long
    as the connection retries (its ``retry_s``). Retryable."""

    code = "daemon_unreachable"
    default_retryable = True

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(
            f"no daemon answers at {url} ({reason}); is `corral serve` running there?",
            url=url,
            reason=reason,
        )
        self.url = url
        self.reason = reason


class ClientSettingError(UsageError):
    """A setting the client needs was given neither as an argument nor in the environment
    (``CORRAL_URL``, ``CORRAL_TOKEN``, ``CORRAL_AGENT_ID``)."""

    code = "client_setting_missing"

    def __init__(self, where: str, argument: str, variable: str) -> None:
        super().__init__(
            f"{where}: no {argument} given and ${variable} is not set (an agent the daemon "
            f"runs has it in its environment; elsewhere give {argument}= or set {variable})",
            where=where,
            argument=argument,
            variable=variable,
        )
