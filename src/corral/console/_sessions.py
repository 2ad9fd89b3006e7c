"""The console's sessions: kept in the daemon's memory only, each behind an opaque random id
that the browser holds in an HttpOnly, SameSite=Strict cookie.

A session keeps the token it was opened with (in memory, never in the cookie), and every
request identifies that token again exactly as the HTTP API's gate does, so a named token
revoked with ``corral token revoke`` ends its sessions from their next request on. Sessions
end on logout, after ``idle_s`` without a request, ``max_age_s`` after login, and when the
daemon stops.
"""

from __future__ import annotations

import hmac
import secrets
from collections import OrderedDict
from dataclasses import dataclass, field

from corral.daemon._auth import Caller
from corral.daemon._callers import Callers
from corral.kernel import SYSTEM_CLOCK, Clock
from corral.kernel import _validate as v

MAX_SESSIONS = 10_000
"""Sessions kept at most; past it, the least recently used one ends."""


@dataclass(slots=True)
class Session:
    """One login: who (the token's name), the form token that guards its state-changing
    requests, and when it was opened and last used (the clock's monotonic seconds)."""

    id: str = field(repr=False)
    token: str = field(repr=False)
    name: str
    csrf: str = field(repr=False)
    opened: float
    seen: float


class Sessions:
    """The live sessions of one console, by id."""

    def __init__(
        self,
        callers: Callers,
        *,
        idle_s: float = 8 * 3600.0,
        max_age_s: float = 24 * 3600.0,
        clock: Clock = SYSTEM_CLOCK,
        max_sessions: int = MAX_SESSIONS,
    ) -> None:
        where = "Sessions"
        v.positive_number(where, "idle_s", idle_s)
        v.positive_number(where, "max_age_s", max_age_s)
        v.positive_int(where, "max_sessions", max_sessions)
        self._callers = callers
        self._idle_s = idle_s
        self._max_age_s = max_age_s
        self._clock = clock
        self._max = max_sessions
        self._live: OrderedDict[str, Session] = OrderedDict()

    def identify(self, token: str) -> Caller | None:
        """Who ``token`` belongs to, as the API's gate says (None: no token of this daemon)."""
        return self._callers.of(token)

    def open(self, token: str, caller: Caller) -> Session:
        """A new session for an operator ``caller`` identified by ``token``."""
        now = self._clock.monotonic()
        session = Session(
            id=secrets.token_urlsafe(32),
            token=token,
            name=caller.name,
            csrf=secrets.token_urlsafe(32),
            opened=now,
            seen=now,
        )
        self._live[session.id] = session
        while len(self._live) > self._max:
            self._live.popitem(last=False)
        return session

    def get(self, session_id: str | None) -> Session | None:
        """The live session of that id, or None (ending it when it has expired or its token
        no longer opens the daemon as the same person)."""
        if not session_id or len(session_id) > 128:
            return None
        session = self._live.get(session_id)
        if session is None:
            return None
        now = self._clock.monotonic()
        caller = self._callers.of(session.token)
        if (
            now - session.seen > self._idle_s
            or now - session.opened > self._max_age_s
            or caller is None
            or not caller.is_operator
            or caller.name != session.name
        ):
            self.close(session_id)
            return None
        session.seen = now
        self._live.move_to_end(session_id)
        return session

    def close(self, session_id: str) -> None:
        """End the session (logout); nothing when there is none."""
        self._live.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._live)


def same_secret(given: str | None, expected: str) -> bool:
    """Whether the form token ``given`` is ``expected`` (constant time)."""
    if not given or len(given) > 256:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode())
