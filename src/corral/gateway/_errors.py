"""The gateway's refusals and failures: one ``GatewayError`` with a stable code each, and
:func:`sqlstate_code` / :func:`database_refusal`, which classify and word alike on every
engine what the database itself refused (bad data, a broken constraint, a conflict with a
concurrent transaction, anything else)."""

from __future__ import annotations

from typing import Any

from corral.kernel import RefusalError

# code -> retryable (the daemon keeps each code's HTTP status)
CODES: dict[str, bool] = {
    "parse_error": False,
    "statement_too_complex": False,
    "multiple_statements": False,
    "forbidden_statement": False,
    "forbidden_function": False,
    "unknown_table": False,
    "unknown_column": False,
    "invalid_operation": False,
    "idempotency_key_required": False,
    "read_only_violation": False,
    "idempotency_conflict": False,
    "idempotency_in_progress": True,
    "outcome_unknown": False,
    "agent_frozen": False,
    "pool_exhausted": True,
    "analysis_busy": True,
    "analysis_error": False,
    "statement_timeout": True,
    "result_too_large": False,
    "invalid_data": False,
    "constraint_violation": False,
    "transaction_conflict": True,
    "database_error": False,
    "database_unavailable": True,
}


class GatewayError(RefusalError):
    """A request the gateway refused or could not complete.

    ``code`` is one of :data:`CODES`; ``details`` holds what the agent can act on (close
    matches for a misspelt column, the statement that tripped a breaker, ...).
    """

    code = "gateway_error"

    def __init__(self, code: str, message: str, **details: Any) -> None:
        if code not in CODES:
            raise ValueError(f"unknown gateway error code {code!r}")
        super().__init__(message, retryable=CODES[code], **details)
        self.code = code  # type: ignore[misc]  # per instance: one class, many codes


def statement_too_long(chars: int, limit: int) -> GatewayError:
    """The refusal of a statement of ``chars`` characters, past ``limit``."""
    return GatewayError(
        "statement_too_complex",
        f"the statement is {chars} characters long; the gateway takes at most {limit}: "
        "split the work, or pass long lists of values as parameters",
        limit=limit,
        chars=chars,
    )


# SQLSTATEs of a transaction rolled back for a concurrent one: serialization failure, deadlock.
_CONFLICT_STATES = frozenset({"40001", "40P01"})

_REFUSED: dict[str, tuple[str, str]] = {
    # code -> (what happened, what the agent can do)
    "invalid_data": (
        "the statement failed on a value",
        "; the same request fails the same way: change the value, or the expression that "
        "produced it",
    ),
    "constraint_violation": (
        "the write breaks a constraint",
        "; the same request fails the same way while the data stays as it is",
    ),
    "transaction_conflict": (
        "the statement conflicted with a concurrent transaction and was rolled back",
        "; retry it (a write with the same idempotency key)",
    ),
    "database_error": ("the database refused the statement", ""),
}


def sqlstate_code(sqlstate: str | None) -> str:
    """The code of a statement refused with ``sqlstate``: class 22 (data exception)
    ``invalid_data``, class 23 (integrity) ``constraint_violation``, 40001 and 40P01
    (serialization failure, deadlock) ``transaction_conflict``, anything else (or None)
    ``database_error``."""
    if not sqlstate:
        return "database_error"
    if sqlstate.startswith("22"):
        return "invalid_data"
    if sqlstate.startswith("23"):
        return "constraint_violation"
    if sqlstate in _CONFLICT_STATES:
        return "transaction_conflict"
    return "database_error"


def database_refusal(code: str, message: str, **details: Any) -> GatewayError:
    """The ``GatewayError`` for a statement the database refused with ``message`` (its own
    words), as ``code`` (``invalid_data``, ``constraint_violation``, ``transaction_conflict``
    or ``database_error``); ``details`` are passed on. Raises ``ValueError`` for another
    code."""
    if code not in _REFUSED:
        raise ValueError(f"not a database refusal code: {code!r}")
    what, advice = _REFUSED[code]
    return GatewayError(code, f"{what}: {message}{advice}", **details)
