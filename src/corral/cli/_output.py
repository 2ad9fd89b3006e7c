"""What commands print: consoles, tables, table cells (rich markup in data shown as it is,
never interpreted; control characters shown as escapes), coloured states and JSON for
programs. rich is imported on first use.
"""

import json
import os
import re
import sys
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

STATE_STYLES = {
    "running": "cyan",
    "waiting": "magenta",
    "idle": "green",
    "blocked": "yellow",
    "paused": "blue",
    "failed": "red",
    "stopped": "dim",
}


# What a terminal would act on rather than show: C0 and C1 controls (escape sequences, bells,
# carriage returns, newlines), DEL, line separators and bidirectional overrides. Text from an
# agent or a person is printed with these escaped, so it cannot rewrite the screen or forge a
# line of output.
# Lone surrogates too: no terminal encoding can print them.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(found: "re.Match[str]") -> str:
    char = found.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str) -> str:
    """``text`` with control characters shown as escapes (``\\x1b``, ``\\n``, ``\\u202e``):
    for everything printed that came from an agent or a person."""
    return _CONTROL.sub(_escaped, text)


def say(text: str, *, err: bool = False) -> None:
    """Print one line of plain text (no markup), control characters escaped."""
    (stderr() if err else stdout()).print(visible(text), markup=False, highlight=False)


class ReaderGone(Exception):
    """Whoever read the output went away (``corral events | head -1``): the command stops
    quietly, as Unix tools do (``main`` catches it). An ``Exception``, not rich's
    ``SystemExit``, so that a stream being followed is closed like on any error."""


def reader_gone() -> NoReturn:
    """Point stdout at /dev/null (so the interpreter's last flush does not complain) and raise
    :class:`ReaderGone`."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    raise ReaderGone


def write_line(text: str) -> None:
    """One line on stdout, flushed (JSON for programs)."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        reader_gone()


def stdout() -> "Console":
    from rich.console import Console

    console = Console(highlight=False, soft_wrap=False)
    console.on_broken_pipe = reader_gone  # type: ignore[method-assign]
    return console


def stderr() -> "Console":
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


def table(*headers: str, title: str | None = None, show_header: bool = True) -> "Table":
    """An empty table with these column headers (the title is shown as it is: pass what came
    from an agent through ``cell``). Print it with :func:`print_fitted`."""
    from rich.table import Table

    return Table(*headers, title=title, show_header=show_header)


def print_table(
    title: str,
    rows: list[dict[str, Any]],
    keys: list[str],
    *,
    headers: dict[str, str] | None = None,
) -> None:
    """Rows as a table that fits the terminal, one column per key (a ``state`` column is
    coloured)."""
    names = headers or {}
    shown = table(*(names.get(k, k) for k in keys), title=plain(title))
    for row in rows:
        shown.add_row(*(state(row.get(k)) if k == "state" else cell(row.get(k)) for k in keys))
    print_fitted(shown)


# Columns shown whole however narrow the terminal: identifiers, which are copied to the next
# command, and any column whose cells are this short.
WHOLE = frozenset({"id", "agent", "parent", "from", "decision", "run", "field", "target"})
SHORT = 10
MIN_WIDTH = 4  # a column cut to fit keeps at least this much ("nam…")


def print_fitted(shown: "Table") -> None:
    """Print ``shown`` within the terminal's width, one line a row: a cell too long for its
    column is cut with an ellipsis, never wrapped (``--json`` has every value whole)."""
    console = stdout()
    fit(shown, console.width)
    console.print(shown)


def fit(shown: "Table", width: int) -> None:
    """Set the columns of ``shown`` to one line a cell within ``width`` characters: the
    columns of :data:`WHOLE` and the short ones keep their natural width, the others share
    what is left (the narrowest get all they need first, the wider ones the rest equally)."""
    from rich.text import Text

    def length(value: Any) -> int:
        return Text.from_markup(value).cell_len if isinstance(value, str) else 0

    natural: list[int] = []
    for column in shown.columns:
        column.no_wrap = True
        column.overflow = "ellipsis"
        lengths = [length(c) for c in column.cells]
        if shown.show_header:
            lengths.append(length(column.header))
        natural.append(max(lengths, default=0))
    # Each column takes a space either side and a rule: 3 characters, and one for the edge.
    left = width - 3 * len(natural) - 1
    if sum(natural) <= left:
        return
    cut = [
        i
        for i, column in enumerate(shown.columns)
        if natural[i] > SHORT and str(column.header) not in WHOLE
    ]
    left -= sum(n for i, n in enumerate(natural) if i not in cut)
    cut.sort(key=natural.__getitem__)
    for done, i in enumerate(cut):
        share = max(MIN_WIDTH, left // (len(cut) - done))
        given = min(natural[i], share)
        shown.columns[i].max_width = given
        left -= given


def cell(value: Any) -> str:
    """``value`` as table text: rich markup in it (a ``[/bold]`` in a row or a reason) is
    shown as it is, never interpreted."""
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return plain(json.dumps(value, separators=(",", ":"), default=str))
    return plain(str(value))


def plain(text: str) -> str:
    """``text`` with rich markup and control characters escaped."""
    from rich.markup import escape

    return escape(visible(text))


def state(value: Any) -> str:
    """An agent's state as a cell, coloured by ``STATE_STYLES``."""
    text = cell(value)
    style = STATE_STYLES.get(text)
    return f"[{style}]{text}[/{style}]" if style else text


def print_json(value: Any) -> None:
    # Plain print: JSON output is for programs, with no wrapping or markup.
    write_line(json.dumps(value, indent=2, default=str))
