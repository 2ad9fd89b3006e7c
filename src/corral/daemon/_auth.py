"""Bearer tokens scoped to one agent and its descendants, derived from the daemon's token.

Nothing is stored: an agent's token is an HMAC of its id keyed with the daemon's token (see
docs/daemon.md, "Security").
"""

from __future__ import annotations

import hashlib
import hmac

PREFIX = "corral-agent."
_DOMAIN = b"corral agent token v1:"


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


AGENT_SCOPE_KEY = "corral.agent"
"""The ASGI scope key under which the HTTP gate puts the agent whose token a request carries."""
