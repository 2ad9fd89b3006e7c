"""``SQLiteGateway``: the name a SQLite file's gateway had before ``Gateway.connect`` took
``sqlite:///`` DSNs, kept with its ``connect(path, ...)``."""

from __future__ import annotations

from pathlib import Path

from corral.gateway._bounds import DEFAULT_MAX_BYTES
from corral.gateway._breaker_records import BreakerPolicy
from corral.gateway._connector import Connector
from corral.gateway._gateway import DEFAULT_MAX_STATEMENT_CHARS, Gateway, OnFreezeHook
from corral.gateway.sqlite._engine import SQLiteEngine, sqlite_engine
from corral.kernel import SYSTEM_CLOCK, Clock

__all__ = ["SQLiteGateway"]

_DEFAULT_BREAKER = BreakerPolicy()


class SQLiteGateway(Gateway):
    """A :class:`Gateway` on one SQLite database file. Create with :meth:`connect`."""

    # A path, not a DSN, and only SQLite's keywords: not the signature of Gateway.connect.
    @classmethod
    def connect(  # type: ignore[override]
        cls,
        path: str | Path,
        *,
        journal_path: str | Path | None = None,
        statement_timeout_s: float = 5,
        max_rows: int = 1000,
        max_bytes: int = DEFAULT_MAX_BYTES,
        breaker: BreakerPolicy | None = _DEFAULT_BREAKER,
        clock: Clock = SYSTEM_CLOCK,
        on_freeze: OnFreezeHook | None = None,
        max_statement_chars: int = DEFAULT_MAX_STATEMENT_CHARS,
    ) -> Connector[SQLiteGateway]:
        """A gateway to the existing SQLite file ``path``, opened when awaited or entered;
        the same as ``Gateway.connect("sqlite:///" + path, ...)``.

        ``journal_path``: the breakers' freeze journal (default: the target's path with
        ``.corral-journal`` appended; never the target itself). Arguments are checked here
        (``InvalidArgumentError``); opening raises ``GatewayError("database_unavailable")``
        when the file cannot be opened.
        """
        where = "SQLiteGateway.connect"
        engine = sqlite_engine(
            where,
            path,
            journal_path=journal_path,
            statement_timeout_s=statement_timeout_s,
            max_rows=max_rows,
            max_bytes=max_bytes,
            clock=clock,
        )
        hooks = cls._hooks_of(where, clock, breaker, None, None, on_freeze, max_statement_chars)
        return Connector(cls(engine, hooks))

    @property
    def keys_in_flight_at_open(self) -> int:
        """How many keys were journalled ``in_flight`` when the gateway opened (each is
        reported ``outcome_unknown`` on use). Always 0 for keys this gateway journalled: a
        key and its write commit together."""
        engine = self._engine
        return engine.keys_in_flight_at_open if isinstance(engine, SQLiteEngine) else 0
