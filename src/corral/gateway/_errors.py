"""The gateway's refusals and failures: one ``GatewayError`` with a stable code each."""

from __future__ import annotations

from typing import Any

from corral.kernel import RefusalError

# code -> (HTTP status, retryable)
CODES: dict[str, tuple[int, bool]] = {
    "parse_error": (400, False),
    "multiple_statements": (400, False),
    "forbidden_statement": (400, False),
    "forbidden_function": (400, False),
    "unknown_table": (400, False),
    "unknown_column": (400, False),
    "invalid_operation": (400, False),
    "idempotency_key_required": (400, False),
    "read_only_violation": (400, False),
    "idempotency_conflict": (422, False),
    "idempotency_in_progress": (409, True),
    "outcome_unknown": (409, False),
    "agent_frozen": (423, False),
    "pool_exhausted": (429, True),
    "statement_timeout": (408, True),
    "database_error": (500, False),
    "database_unavailable": (503, True),
}


class GatewayError(RefusalError):
    """A request the gateway refused or could not complete.

    ``code`` is one of :data:`CODES`; ``status`` the HTTP status the daemon answers with;
    ``details`` holds what the agent can act on (close matches for a misspelt column, the
    statement that tripped a breaker, ...).
    """

    code = "gateway_error"

    def __init__(self, code: str, message: str, **details: Any) -> None:
        if code not in CODES:
            raise ValueError(f"unknown gateway error code {code!r}")
        status, retryable = CODES[code]
        super().__init__(message, retryable=retryable, **details)
        self.code = code  # type: ignore[misc]  # per instance: one class, many codes
        self.status = status
