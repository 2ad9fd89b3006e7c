"""libpg_query's JSON parse tree: a node is ``{"TypeName": {fields}}``, fields keep the names of
PostgreSQL's C structs, and fields at their default value are left out."""

from __future__ import annotations

from typing import Any

__all__ = ["Node", "char_position", "string_literal", "string_names", "unwrap"]

Node = dict[str, Any]


def unwrap(node: Any) -> tuple[str, Node]:
    """``("TypeName", fields)`` of a node; ``("", node)`` for anything else."""
    if type(node) is dict and len(node) == 1:
        for kind, body in node.items():
            if kind[:1].isupper() and type(body) is dict:
                return kind, body
    return "", node if type(node) is dict else {}


def char_position(sql: str, byte_offset: int) -> int:
    """1-based character position of a 0-based UTF-8 byte offset (a node's ``location``)."""
    if sql.isascii():
        return max(byte_offset, 0) + 1
    head = sql.encode("utf-8")[: max(byte_offset, 0)]
    return len(head.decode("utf-8", errors="ignore")) + 1


def string_names(nodes: Any) -> list[str]:
    """The names of a list of ``String`` nodes (a qualified name, a function's name)."""
    return [n["String"].get("sval", "") for n in nodes if "String" in n]


def string_literal(node: Any) -> str | None:
    """The text of a string constant, also under a cast (``'TimeZone'::text``); else None."""
    kind, body = unwrap(node)
    if kind == "TypeCast":
        kind, body = unwrap(body.get("arg"))
    if kind == "A_Const" and "sval" in body:
        return str(body["sval"].get("sval", ""))
    return None
