"""A tokenizer that follows SQLite's own: statements, keywords, placeholders, quoting."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ASCII_LOWER",
    "BLOB",
    "NUMBER",
    "OTHER",
    "PARAM",
    "QUOTED",
    "SEMI",
    "STRING",
    "WORD",
    "Token",
    "cte_names",
    "split_statements",
    "tokenize",
]

WORD, QUOTED, STRING, BLOB, NUMBER, PARAM, SEMI, OTHER = (
    "word",
    "quoted",
    "string",
    "blob",
    "number",
    "param",
    "semi",
    "other",
)

_SPACE = frozenset(" \t\n\v\f\r")  # sqlite3Isspace
_BOM = "\ufeff"  # SQLite skips a byte-order mark wherever a token may start
_OPERATORS = ("->>", "->", "||", "<=", ">=", "<>", "!=", "==", "<<", ">>")
ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


@dataclass(frozen=True, slots=True)
class Token:
    """One token of SQL text: ``kind`` (``word``, ``quoted`` identifier, ``string``,
    ``blob``, ``number``, ``param``, ``semi``, ``other``), its text and ``[start, end)``."""

    kind: str
    text: str
    start: int
    end: int

    @property
    def upper(self) -> str:
        return self.text.upper() if self.kind == WORD else ""

    @property
    def name(self) -> str:
        """An identifier's name: a word as written, a quoted one without its quotes."""
        if self.kind != QUOTED:
            return self.text
        body = self.text[1:-1] if len(self.text) >= 2 else ""
        if self.text[0] == "[":
            return body
        quote = self.text[0]
        return body.replace(quote * 2, quote)


def _id_char(c: str) -> bool:
    # SQLite's IdChar: ASCII letters and digits, "_", "$", and every byte of a multi-byte
    # UTF-8 character.
    return not c.isascii() or c.isalnum() or c in "_$"


def _quoted_end(sql: str, i: int, quote: str) -> int:
    j = i + 1
    while True:
        k = sql.find(quote, j)
        if k < 0:
            return len(sql)  # unterminated: SQLite refuses it, the tokenizer only reports it
        if sql.startswith(quote, k + 1):
            j = k + 2
            continue
        return k + 1


def _number_end(sql: str, i: int) -> int:
    n = len(sql)
    if sql.startswith(("0x", "0X"), i) and i + 2 < n and sql[i + 2] in "0123456789abcdefABCDEF":
        i += 2
    else:
        while i < n and sql[i].isascii() and sql[i].isdigit():
            i += 1
        if i < n and sql[i] == ".":
            i += 1
            while i < n and sql[i].isascii() and sql[i].isdigit():
                i += 1
        if i < n and sql[i] in "eE":
            j = i + 1
            if j < n and sql[j] in "+-":
                j += 1
            if j < n and sql[j].isascii() and sql[j].isdigit():
                i = j
    while i < n and _id_char(sql[i]):  # "12abc" is one (illegal) token for SQLite too
        i += 1
    return i


def _variable_end(sql: str, i: int) -> int:
    # "$", "@", ":" or "#" then identifier characters, with TCL's "::" and "(...)" forms.
    n, j, chars = len(sql), i + 1, 0
    while j < n:
        c = sql[j]
        if _id_char(c):
            chars += 1
            j += 1
        elif c == "(" and chars:
            while j < n and sql[j] not in _SPACE and sql[j] != ")":
                j += 1
            return min(j + 1, n)
        elif c == ":" and sql.startswith("::", j):
            j += 2
        else:
            break
    return j if chars else i + 1


def tokenize(sql: str) -> list[Token]:
    """``sql`` as SQLite's tokenizer splits it, without whitespace and comments.

    Never raises: text SQLite would refuse (an unterminated string, an illegal character)
    still becomes tokens, and SQLite's own compilation refuses it later.
    """
    out: list[Token] = []
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c in _SPACE or c == _BOM:
            i += 1
            continue
        if c == "-" and sql.startswith("--", i):
            j = sql.find("\n", i)
            i = n if j < 0 else j + 1
            continue
        if c == "/" and sql.startswith("/*", i):
            j = sql.find("*/", i + 2)
            i = n if j < 0 else j + 2
            continue
        start = i
        if c == "'":
            kind, i = STRING, _quoted_end(sql, i, "'")
        elif c in '"`':
            kind, i = QUOTED, _quoted_end(sql, i, c)
        elif c == "[":
            j = sql.find("]", i + 1)
            kind, i = QUOTED, (n if j < 0 else j + 1)
        elif c in "xX" and sql.startswith("'", i + 1):
            kind, i = BLOB, _quoted_end(sql, i + 1, "'")
        elif (c.isascii() and c.isdigit()) or (
            c == "." and i + 1 < n and sql[i + 1].isascii() and sql[i + 1].isdigit()
        ):
            kind, i = NUMBER, _number_end(sql, i)
        elif c == "?":
            i += 1
            while i < n and sql[i].isascii() and sql[i].isdigit():
                i += 1
            kind = PARAM
        elif c in "$@:#":
            i = _variable_end(sql, i)
            kind = PARAM if i > start + 1 else OTHER
        elif _id_char(c):
            while i < n and _id_char(sql[i]):
                i += 1
            kind = WORD
        elif c == ";":
            kind, i = SEMI, i + 1
        else:
            kind = OTHER
            i += next((len(op) for op in _OPERATORS if sql.startswith(op, i)), 1)
        out.append(Token(kind, sql[start:i], start, i))
    return out


def cte_names(tokens: list[Token]) -> frozenset[str]:
    """The names (lower case) every ``WITH`` clause of the statement defines."""
    names: set[str] = set()
    for i, token in enumerate(tokens):
        if token.upper == "WITH":
            names.update(_with_clause(tokens, i + 1))
    return frozenset(names)


def _with_clause(tokens: list[Token], i: int) -> list[str]:
    # WITH [RECURSIVE] name [(columns)] AS [NOT] [MATERIALIZED] (body) [, ...]
    names: list[str] = []
    if i < len(tokens) and tokens[i].upper == "RECURSIVE":
        i += 1
    while i < len(tokens) and tokens[i].kind in (WORD, QUOTED):
        name = tokens[i].name.lower()
        i += 1
        if i < len(tokens) and tokens[i].text == "(":
            i = _after_parens(tokens, i)
        if i >= len(tokens) or tokens[i].upper != "AS":
            break
        i += 1
        while i < len(tokens) and tokens[i].upper in ("NOT", "MATERIALIZED"):
            i += 1
        if i >= len(tokens) or tokens[i].text != "(":
            break
        names.append(name)
        i = _after_parens(tokens, i)
        if i >= len(tokens) or tokens[i].text != ",":
            break
        i += 1
    return names


def _after_parens(tokens: list[Token], i: int) -> int:
    depth = 0
    for j in range(i, len(tokens)):
        if tokens[j].text == "(":
            depth += 1
        elif tokens[j].text == ")":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(tokens)


def split_statements(tokens: list[Token]) -> list[list[Token]]:
    statements: list[list[Token]] = [[]]
    for token in tokens:
        if token.kind == SEMI:
            statements.append([])
        else:
            statements[-1].append(token)
    return [s for s in statements if s]
