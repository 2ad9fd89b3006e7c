"""Who a presented token belongs to: the one lookup the HTTP gate makes for every request,
kept apart so that another front door of the same daemon (the console's login and its
sessions) identifies people exactly as the API does, revocations included."""

from __future__ import annotations

import hmac

from corral.daemon._auth import OPERATOR, PREFIX, Caller, agent_of_token
from corral.daemon._tokens import TokenIndex


class Callers:
    """Identifies tokens of the daemon whose own token is ``secret``: the daemon's own
    (the operator :data:`~._auth.OPERATOR`), an agent's (an HMAC of its id), or a live named
    operator token (looked up in ``named`` by its digest, so a revoked one is refused from
    the next lookup on)."""

    __slots__ = ("_named", "_secret", "_token")

    def __init__(self, secret: str, named: TokenIndex) -> None:
        self._secret = secret
        self._token = secret.encode()
        self._named = named

    def of(self, presented: str) -> Caller | None:
        """Who ``presented`` is the token of, or None (compared in constant time)."""
        if hmac.compare_digest(presented.encode("utf-8", "surrogatepass"), self._token):
            return Caller(OPERATOR)
        if presented.startswith(PREFIX):
            agent = agent_of_token(self._secret, presented)
            return None if agent is None else Caller(agent, agent)
        name = self._named.name_of(presented)
        return None if name is None else Caller(name)
