"""What a daemon needs to know of several daemons without importing a database driver."""

from __future__ import annotations

from corral.kernel import InvalidArgumentError

__all__ = ["DEFAULT_LEASE_S", "FORWARDED_HEADER", "check_node_name"]

DEFAULT_LEASE_S = 4.0
"""A node's lease: renewed every quarter of it, so a dead node's agents are adopted within
``lease_s + lease_s / 4`` seconds (5 s by default)."""

FORWARDED_HEADER = "x-corral-forwarded-by"
"""Set on a forwarded request to the name of the daemon that forwarded it."""


def check_node_name(where: str, name: object) -> None:
    """A node name: a letter, then up to 62 letters, digits, ``_``, ``-`` or ``.``."""
    ok = (
        isinstance(name, str)
        and 0 < len(name) <= 63
        and name.isascii()
        and name[0].isalpha()
        and all(c.isalnum() or c in "_-." for c in name)
    )
    if not ok:
        raise InvalidArgumentError(
            where, "node", "a letter, then up to 62 letters, digits, '_', '-' or '.'", name
        )
