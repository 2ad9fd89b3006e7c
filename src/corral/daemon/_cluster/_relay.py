"""Commands that callers inside a daemon give (the console, MCP tools) about an agent another
daemon owns: sent to that daemon over HTTP, in the caller's name, as the HTTP API's own
forwarding does for requests (``_forward``)."""

from __future__ import annotations

from collections import OrderedDict

from corral.daemon._auth import ACTING_AS_HEADER, OPERATOR, agent_token
from corral.daemon._client import HttpApi
from corral.daemon._cluster._naming import FORWARDED_HEADER
from corral.daemon._cluster._node import Node
from corral.daemon._errors import OwnerUnreachableError

__all__ = ["NodeRelay"]

_KEPT = 32  # clients kept open (one per owner and caller); the oldest is closed beyond


class NodeRelay:
    """Finds the daemon that owns an agent and gives a client of it that acts as the caller:
    an agent's own token for an agent (its reach is checked there again), the daemon's token
    naming the person (``x-corral-as``) for an operator. ``token`` is the daemon's token,
    the same on every daemon of the store. Long waits (an action check waiting for a person)
    are allowed up to ten minutes."""

    def __init__(self, node: Node, token: str) -> None:
        self._node = node
        self._token = token
        self._clients: OrderedDict[tuple[str, str, str], HttpApi] = OrderedDict()

    async def api_for(
        self, agent_id: str, caller_name: str | None, principal: str | None
    ) -> HttpApi | None:
        """A client of ``agent_id``'s owner acting as the caller, or None when this daemon
        owns it (or nobody does yet: it is then refused here, ``not_owner``, when written).
        Raises :class:`OwnerUnreachableError` when its owner is not live."""
        if self._node.owns(agent_id):
            return None
        owner = await self._node.owner_of(agent_id)
        if owner is None or owner.node == self._node.name:
            return None
        if not owner.live:
            retry = self._node.adoption_within_s(owner)
            raise OwnerUnreachableError(agent_id, owner.node, "not live", retry)
        if principal is not None:
            token, acting_as = agent_token(self._token, principal), ""
        else:
            token, acting_as = self._token, caller_name or OPERATOR
        key = (owner.url, token, acting_as)
        api = self._clients.get(key)
        if api is None:
            headers = {FORWARDED_HEADER: self._node.name}
            if acting_as and acting_as != OPERATOR:
                headers[ACTING_AS_HEADER] = acting_as
            api = self._clients[key] = HttpApi(
                owner.url, token=token, headers=headers, timeout_s=600.0
            )
            while len(self._clients) > _KEPT:
                _, old = self._clients.popitem(last=False)
                await old.aclose()
        else:
            self._clients.move_to_end(key)
        return api

    async def aclose(self) -> None:
        for api in self._clients.values():
            await api.aclose()
        self._clients.clear()
