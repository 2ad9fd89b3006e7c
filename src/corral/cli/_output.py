"""What commands print: consoles, tables, table cells (rich markup in data shown as it is,
never interpreted), coloured states and JSON for programs. rich is imported on first use.
"""

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

STATE_STYLES = {
    "running": "cyan",
    "idle": "green",
    "blocked": "yellow",
    "failed": "red",
    "stopped": "dim",
}


def stdout() -> "Console":
    from rich.console import Console

    return Console(highlight=False, soft_wrap=False)


def stderr() -> "Console":
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


def print_table(
    title: str,
    rows: list[dict[str, Any]],
    keys: list[str],
    *,
    headers: dict[str, str] | None = None,
) -> None:
    """Rows as a rich table, one column per key (a ``state`` column is coloured)."""
    from rich.table import Table

    names = headers or {}
    table = Table(*(names.get(k, k) for k in keys), title=plain(title))
    for row in rows:
        table.add_row(*(state(row.get(k)) if k == "state" else cell(row.get(k)) for k in keys))
    stdout().print(table)


def cell(value: Any) -> str:
    """``value`` as table text: rich markup in it (a ``[/bold]`` in a row or a reason) is
    shown as it is, never interpreted."""
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return plain(json.dumps(value, separators=(",", ":"), default=str))
    return plain(str(value))


def plain(text: str) -> str:
    """``text`` with rich markup escaped."""
    from rich.markup import escape

    return escape(text)


def state(value: Any) -> str:
    """An agent's state as a cell, coloured by ``STATE_STYLES``."""
    text = cell(value)
    style = STATE_STYLES.get(text)
    return f"[{style}]{text}[/{style}]" if style else text


def print_json(value: Any) -> None:
    # Plain print: JSON output is for programs, with no wrapping or markup.
    print(json.dumps(value, indent=2, default=str))
