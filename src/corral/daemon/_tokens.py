"""Named operator tokens: a person's own token (``corral token create alice``), kept in the
event log as the SHA-256 of its secret only, and looked up by that digest.

The daemon's own token is named :data:`~._auth.OPERATOR`; agents' tokens are derived from it
(``_auth``). Each decision here is pure (the state in, the event out); the service commits.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from typing import Any

from corral.daemon import _events as ev
from corral.daemon._auth import OPERATOR, token_sha256
from corral.daemon._errors import InvalidRequestError, TokenExistsError, TokenNotFoundError
from corral.daemon._events import NewEvent
from corral.daemon._records import TokenRecord
from corral.daemon._state import State

MAX_NAME = 64
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.@-]*", re.ASCII)
SECRET_PREFIX = "corral-op."

Json = dict[str, Any]


def name_problem(name: object) -> str | None:
    """What is wrong with ``name`` as a token's name, or None: a letter first, then letters,
    digits, ``_``, ``.``, ``@`` or ``-``; at most :data:`MAX_NAME` characters."""
    if not isinstance(name, str):
        return f"must be a string, got {type(name).__name__}"
    if len(name) > MAX_NAME:
        return f"must be at most {MAX_NAME} characters, got {len(name)}"
    if not _NAME.fullmatch(name):
        return (
            "must start with a letter and hold only letters, digits, '_', '.', '@' or '-' "
            f"(got {name[:MAX_NAME]!r})"
        )
    return None


def check_name(name: object) -> str:
    """``name`` when it is a valid token name; else ``InvalidRequestError`` (400)."""
    problem = name_problem(name)
    if problem is not None:
        raise InvalidRequestError([{"field": "name", "message": problem}], "token name")
    assert isinstance(name, str)
    return name


def new_secret(name: str) -> str:
    """A fresh secret for the token ``name``: 32 random bytes, URL-safe, with a prefix that
    says what it is (secret scanners and people can tell a corral token from others)."""
    return f"{SECRET_PREFIX}{name}.{secrets.token_urlsafe(32)}"


def live(state: State) -> list[TokenRecord]:
    """The tokens not revoked, oldest first."""
    found = [t for t in state.tokens.values() if t["revokedAt"] is None]
    return sorted(found, key=lambda t: (t["createdAt"], t["name"]))


def shown(record: TokenRecord) -> Json:
    """A token as the API shows it: never its secret, never its digest."""
    answer: Json = {"name": record["name"], "createdAt": record["createdAt"], "by": record["by"]}
    if record["revokedAt"] is not None:
        answer |= {"revokedAt": record["revokedAt"], "revokedBy": record["revokedBy"]}
    return answer


def creation(state: State, name: object, by: str | None) -> tuple[str, NewEvent]:
    """A new token ``name`` made by ``by``: its secret (shown once, never stored) and the
    event that records its digest.

    Raises ``InvalidRequestError`` for a bad name and :class:`TokenExistsError` when the
    name is :data:`OPERATOR` or a live token's, case ignored (two people whose names differ
    only in case would be told apart by no one reading the log).
    """
    checked = check_name(name)
    folded = checked.casefold()
    if folded == OPERATOR:
        raise TokenExistsError(checked, OPERATOR, None)
    for record in live(state):
        if record["name"].casefold() == folded:
            raise TokenExistsError(checked, record["name"], record["createdAt"])
    secret = new_secret(checked)
    return secret, ev.token_created(checked, token_sha256(secret), by)


def revocation(state: State, name: str, by: str | None) -> NewEvent:
    """The event that revokes the live token ``name``; :class:`TokenNotFoundError` when no
    live token has that exact name."""
    record = state.tokens.get(name)
    if record is None or record["revokedAt"] is not None:
        raise TokenNotFoundError(name)
    return ev.token_revoked(name, by)


class TokenIndex:
    """The live named tokens by the digest of their secret, for the gate's lookups.

    Rebuilt from the store's state whenever that state has moved on (so a revocation counts
    from the next request on); a lookup is one hash and one dict access.
    """

    __slots__ = ("_by_digest", "_seen", "_state")

    def __init__(self, state: Callable[[], State]) -> None:
        self._state = state
        self._seen: tuple[int, int] | None = None
        self._by_digest: dict[str, str] = {}

    def name_of(self, presented: str) -> str | None:
        """The name of the live token ``presented`` is the secret of, or None."""
        state = self._state()
        version = (id(state), state.last_seq)
        if version != self._seen:
            self._by_digest = {t["sha256"]: t["name"] for t in live(state)}
            self._seen = version
        return self._by_digest.get(token_sha256(presented))
