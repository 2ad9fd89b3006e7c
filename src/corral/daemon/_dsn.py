"""Where a store or a database target lives: the URL and connection-string forms accepted."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from corral.kernel import InvalidArgumentError
from corral.kernel import _validate as v

FORMS = "'sqlite:///PATH', a file path, or 'postgresql://...'"
# The libpq keywords a connection string is likely to start with.
_CONNINFO = re.compile(
    r"^\s*(host|hostaddr|port|dbname|user|password|passfile|service|sslmode|options|"
    r"connect_timeout|application_name|target_session_attrs)\s*="
)


def parse_dsn(url: Any, *, where: str = "open_store", name: str = "url") -> tuple[str, str]:
    """``("sqlite", path)`` or ``("postgresql", dsn)``.

    ``sqlite:///relative/path``, ``sqlite:////absolute/path`` or a bare file path are SQLite;
    ``postgresql://...`` (or ``postgres://``) or a libpq keyword string (starting with a libpq
    keyword and ``=``, so ``host=db dbname=x`` is not taken for a file) are PostgreSQL.
    Anything else raises ``InvalidArgumentError`` (with any password hidden).
    """
    v.non_empty_str(where, name, url)
    if "://" not in url:
        return ("postgresql" if _CONNINFO.match(url) else "sqlite"), url
    scheme = url.split("://", 1)[0].lower()
    if scheme in ("postgresql", "postgres"):
        return "postgresql", url
    if scheme == "sqlite" and url[len("sqlite://") :].startswith("/"):
        path = url[len("sqlite:///") :]
        if path.strip():
            return "sqlite", path
    raise InvalidArgumentError(where, name, FORMS, redacted(url))


def redacted(url: str) -> str:
    """``url`` with its password, if any, shown as ``***``."""
    if "://" not in url:  # a keyword connection string
        return re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", url)
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))
