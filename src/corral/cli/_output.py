"""What commands print: consoles, tables, table cells (rich markup in data shown as it is,
never interpreted; control characters shown as escapes), coloured states and JSON for
programs. rich is imported on first use.
"""

import json
import os
import re
import shutil
import sys
import unicodedata
from typing import TYPE_CHECKING, Any, NoReturn

from corral.daemon._text import visible as visible  # shared with the console

if TYPE_CHECKING:
    from rich.console import Console

STATE_STYLES = {
    "running": "cyan",
    "waiting": "magenta",
    "idle": "green",
    "blocked": "yellow",
    "paused": "blue",
    "failed": "red",
    "stopped": "dim",
}


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


def table(*headers: str, title: str | None = None, show_header: bool = True) -> "Grid":
    """An empty table with these column headers; ``title`` is markup (pass what came from an
    agent through ``cell``). Print it with :func:`print_fitted`."""
    return Grid(headers, title, show_header)


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
    shown = Grid(tuple(names.get(k, k) for k in keys), visible(title), True, title_is_plain=True)
    for row in rows:
        # (text, style) pairs, not markup: nothing to escape, nothing to parse.
        shown.add_row(*(_parts_of(row.get(k), k == "state") for k in keys))
    print_fitted(shown)


# Columns shown whole however narrow the terminal: identifiers, which are copied to the next
# command, and any column whose cells are this short.
WHOLE = frozenset({"id", "agent", "parent", "from", "decision", "run", "field", "target"})
SHORT = 10
MIN_WIDTH = 4  # a column cut to fit keeps at least this much ("nam…")


class Grid:
    """A table drawn as a rich ``Table`` is (its box, title and header styles) but one line a
    row: a cell too long for its column is cut with an ellipsis, never wrapped. Drawn as
    lines of text, it costs a fraction of a rich ``Table`` (which lays out every cell as a
    paragraph): that was most of the time ``corral agents`` took to print 100 agents."""

    def __init__(
        self,
        headers: tuple[str, ...],
        title: str | None,
        show_header: bool,
        *,
        title_is_plain: bool = False,
    ) -> None:
        # ``title`` is markup (see :func:`table`), or plain text when ``title_is_plain``
        self.headers = headers
        self.title = title
        self.title_is_plain = title_is_plain
        self.show_header = show_header
        self.rows: list[list[tuple[str, str]]] = []

    def add_row(self, *cells: Any) -> None:
        """A row of cells: markup (from ``cell``, ``state``), rich ``Text``, or (text,
        style) pairs."""
        self.rows.append([c if isinstance(c, tuple) else _parts(c) for c in cells])

    def widths(self, width: int) -> list[int]:
        """Each column's width so that the table fits in ``width`` characters."""
        natural = [cell_len(h) if self.show_header else 0 for h in self.headers]
        for row in self.rows:
            natural = [max(n, cell_len(text)) for n, (text, _) in zip(natural, row, strict=True)]
        return fit(natural, self.headers, width)

    def render(self, width: int, *, colour: bool = False) -> str:
        """The table as lines of text, within ``width`` cells when it can be (each line cut
        at ``width`` when it cannot), styled with ANSI escapes when ``colour``."""
        sizes = self.widths(width)
        bars = ["─" * (n + 2) for n in sizes]
        heavy = ["━" * (n + 2) for n in sizes]
        out: list[str] = []

        def line(cells: list[tuple[str, str]], rule: str) -> str:
            parts = [rule]
            for (text, style), size in zip(cells, sizes, strict=True):
                shown = _sized(text, size)
                parts.append(f" {_styled(shown, style) if colour else shown} {rule}")
            return "".join(parts)

        across = sum(sizes) + 3 * len(sizes) + 1
        if self.title:
            title = _cut(self.title_text(), across, ellipsis=True)
            left = (across - cell_len(title)) // 2
            right = across - cell_len(title) - left
            shown = _styled(title, "table.title") if colour else title
            out.append(" " * left + shown + " " * right)
        if self.show_header:
            out.append("┏" + "┳".join(heavy) + "┓")
            out.append(line([(h, "table.header") for h in self.headers], "┃"))
            out.append("┡" + "╇".join(heavy) + "┩")
        else:
            out.append("┌" + "┬".join(bars) + "┐")
        out.extend(line(row, "│") for row in self.rows)
        out.append("└" + "┴".join(bars) + "┘")
        if across > width:
            out = [_crop(text, width, colour) for text in out]
        return "\n".join(out)

    def title_text(self) -> str:
        """The title as plain text (markup, as given to :func:`table`, parsed)."""
        if self.title is None:
            return ""
        if self.title_is_plain or "[" not in self.title:
            return self.title  # nothing to parse (and rich not imported)
        from rich.text import Text

        return Text.from_markup(self.title).plain


def _parts(value: Any) -> tuple[str, str]:
    """A cell as (text, style): markup parsed; one style for the whole cell at most."""
    from rich.text import Text

    text = Text.from_markup(value) if isinstance(value, str) else value
    whole = [s for s in text.spans if s.start == 0 and s.end >= len(text.plain)]
    return text.plain, str(whole[0].style) if whole else str(text.style or "")


def _sized(text: str, size: int) -> str:
    """``text`` padded to ``size`` cells, or cut to them with an ellipsis."""
    length = cell_len(text)
    if length <= size:
        return text + " " * (size - length)
    return _cut(text, size, ellipsis=True)


def cell_len(text: str) -> int:
    """How many terminal cells ``text`` takes: two for a wide (East Asian) character, none
    for a combining one, one for the others (its control characters are escaped already)."""
    if text.isascii():
        return len(text)
    return sum(_width(c) for c in text)


def _width(char: str) -> int:
    if unicodedata.combining(char):
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def _cut(text: str, size: int, *, ellipsis: bool = False) -> str:
    """``text`` within ``size`` cells; with ``ellipsis`` its last cell is "…" when cut (a
    wide character that would straddle the edge becomes a space)."""
    if cell_len(text) <= size:
        return text
    if size <= 0:
        return ""
    room = size - 1 if ellipsis else size
    kept: list[str] = []
    used = 0
    for char in text:
        w = _width(char)
        if used + w > room:
            break
        kept.append(char)
        used += w
    return "".join(kept) + " " * (room - used) + ("…" if ellipsis else "")


# rich's names for the styles corral uses, as ANSI SGR codes (rich's default theme for the
# table's own two).
_SGR = {
    "bold": "1",
    "dim": "2",
    "italic": "3",
    "red": "31",
    "green": "32",
    "yellow": "33",
    "blue": "34",
    "magenta": "35",
    "cyan": "36",
    "table.header": "1",
    "table.title": "3",
}


def _styled(text: str, style: str) -> str:
    codes = [_SGR[word] for word in style.split() if word in _SGR]
    return f"\x1b[{';'.join(codes)}m{text}\x1b[0m" if codes and text.strip() else text


def _crop(line: str, width: int, colour: bool) -> str:
    if not colour or "\x1b" not in line:
        return _cut(line, width)
    # Styled: cut the text between escapes, keep the escapes, end with a reset.
    out: list[str] = []
    left = width
    for piece in re.split(r"(\x1b\[[0-9;]*m)", line):
        if piece.startswith("\x1b["):
            out.append(piece)
        elif left > 0:
            kept = _cut(piece, left)
            out.append(kept)
            left -= cell_len(kept)
    return "".join(out) + "\x1b[0m"


def colour_wanted() -> bool:
    """Whether stdout takes colours, as rich decides it: ``NO_COLOR`` set -> no;
    ``FORCE_COLOR`` set -> yes; ``TERM=dumb`` -> no; else whether stdout is a terminal."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    if os.environ.get("TERM", "").lower() in ("dumb", "unknown"):
        return False
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def print_fitted(shown: Grid) -> None:
    """Print ``shown`` within the terminal's width, one line a row (``--json`` has every
    value whole). Written directly, not through rich: a table is most of what ``corral
    agents`` prints, and rich's console is a tenth of a second of a command's start."""
    width = shutil.get_terminal_size((80, 24)).columns
    write_line(shown.render(width, colour=colour_wanted()))


def fit(natural: list[int], headers: tuple[str, ...], width: int) -> list[int]:
    """Column widths within ``width`` characters, from each column's ``natural`` width: the
    columns of :data:`WHOLE` and the short ones keep theirs, the others share what is left
    (the narrowest get all they need first, the wider ones the rest equally)."""
    # Each column takes a space either side and a rule: 3 characters, and one for the edge.
    left = width - 3 * len(natural) - 1
    if sum(natural) <= left:
        return natural
    cut = [i for i, n in enumerate(natural) if n > SHORT and headers[i] not in WHOLE]
    left -= sum(n for i, n in enumerate(natural) if i not in cut)
    sizes = list(natural)
    for done, i in enumerate(sorted(cut, key=natural.__getitem__)):
        sizes[i] = min(natural[i], max(MIN_WIDTH, left // (len(cut) - done)))
        left -= sizes[i]
    return sizes


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


def _shown(value: Any) -> str:
    """``value`` as text to show: control characters escaped, dicts and lists as JSON."""
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return visible(json.dumps(value, separators=(",", ":"), default=str))
    return visible(str(value))


def _parts_of(value: Any, coloured: bool) -> tuple[str, str]:
    text = _shown(value)
    return text, STATE_STYLES.get(text, "") if coloured else ""


def state(value: Any) -> str:
    """An agent's state as a cell, coloured by ``STATE_STYLES``."""
    text = cell(value)
    style = STATE_STYLES.get(text)
    return f"[{style}]{text}[/{style}]" if style else text


def print_json(value: Any) -> None:
    # Plain print: JSON output is for programs, with no wrapping or markup.
    write_line(json.dumps(value, indent=2, default=str))
