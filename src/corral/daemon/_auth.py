"""Who is calling: the daemon's gate identifies every request by its bearer token as a
:class:`Caller`, an operator (a person, or the daemon's own token) or an agent.

An agent's token is an HMAC of its id keyed with the daemon's token, so nothing is stored for
it (see docs/daemon.md, "Security"); named operator tokens are kept as hashes (``_tokens``).
Standard library only: the command line imports this to decide where a token may be sent.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from dataclasses import dataclass

PREFIX = "corral-agent."
_DOMAIN = b"corral agent token v1:"

OPERATOR = "operator"
"""The name of the daemon's own token (reserved: no named token may take it)."""

ACTING_AS_HEADER = "x-corral-as"
"""With the daemon's own token only: the operator a request acts for. Several daemons share
that token; one sends another a person's command in that person's name (``_cluster``)."""

CALLER_SCOPE_KEY = "corral.caller"
"""The ASGI scope key under which the HTTP gate puts the request's :class:`Caller` (the gate
removes any value found there first: only it says who is calling)."""


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a request comes from, as its token says.

    An operator has ``agent`` None and ``name`` the token's name (:data:`OPERATOR` for the
    daemon's own token, else the name given to ``corral token create``); an agent has
    ``agent`` its id and ``name`` the same id.
    """

    name: str
    agent: str | None = None

    @property
    def is_operator(self) -> bool:
        return self.agent is None


def agent_token(secret: str, agent_id: str) -> str:
    """The token of ``agent_id`` under the daemon token ``secret``."""
    mac = hmac.new(secret.encode(), _DOMAIN + agent_id.encode(), hashlib.sha256).hexdigest()
    return f"{PREFIX}{agent_id}.{mac}"


def agent_of_token(secret: str, presented: str) -> str | None:
    """The agent id ``presented`` is the token of, or None when it is no agent token of
    ``secret`` (compared in constant time)."""
    if not presented.startswith(PREFIX):
        return None
    agent_id, dot, _ = presented[len(PREFIX) :].rpartition(".")
    if not dot or not agent_id:
        return None
    expected = agent_token(secret, agent_id)
    if hmac.compare_digest(presented.encode(), expected.encode()):
        return agent_id
    return None


def token_sha256(token: str) -> str:
    """The SHA-256 (hex) of a token: what is stored of a named token, and how it is looked up.

    A lookup by this digest leaks nothing useful through its timing: a client cannot steer
    the digest of what it sends towards a stored one.
    """
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def sendable(token: str) -> bool:
    """Whether ``token`` can travel in an ``Authorization`` header: printable ASCII, no
    spaces."""
    return token.isascii() and token.isprintable() and " " not in token


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals (127.0.0.0/8, ``::1``, bracketed or
    not); a name that merely resolves to loopback does not count."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.removeprefix("[").removesuffix("]")).is_loopback
    except ValueError:
        return False
