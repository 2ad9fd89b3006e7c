"""The HTTP status of every error code the daemon answers with: its own and the gateway's."""

from __future__ import annotations

import sys

from corral.daemon._client import RemoteError
from corral.daemon._errors import DaemonError
from corral.kernel import CorralError, UsageError

# code -> HTTP status, for the daemon's errors (DaemonError) and the gateway's (GatewayError).
STATUS: dict[str, int] = {
    # the agent service
    "daemon_error": 400,
    "invalid_spec": 400,
    "invalid_request": 400,
    "invalid_query": 422,
    "invalid_guardrails_file": 400,
    "unstorable_value": 400,
    "nothing_to_send": 400,
    "answer_not_accepted": 400,
    "token_required": 400,
    "token_file_unsafe": 400,
    "unauthorized": 401,
    "login_refused": 401,  # the console's (corral.console._errors)
    "session_required": 401,
    "csrf_refused": 403,
    "form_invalid": 400,
    "forbidden_origin": 403,
    "out_of_scope": 403,
    "agent_not_found": 404,
    "turn_not_found": 404,
    "decision_not_found": 404,
    "run_not_found": 404,
    "not_found": 404,
    "unknown_target": 404,
    "token_not_found": 404,
    "method_not_allowed": 405,
    "agent_not_live": 409,
    "name_taken": 409,
    "ambiguous_name": 409,
    "agent_busy": 409,
    "agent_live": 409,
    "parent_ended": 409,
    "agent_paused": 409,
    "agent_held": 409,
    "agent_external": 409,
    "not_external": 409,
    "turn_not_open": 409,
    "budget_exhausted": 409,
    "spawn_budget_exceeded": 409,
    "not_frozen": 409,
    "decision_answered": 409,
    "token_exists": 409,
    "body_too_large": 413,
    "unsupported_media_type": 415,
    "idempotency_conflict": 422,
    "internal_error": 500,
    "gateway_not_installed": 500,
    "otel_not_installed": 500,
    "store_unavailable": 503,
    "shutting_down": 503,
    "not_owner": 503,
    "owner_unreachable": 503,
    "node_not_found": 422,
    "node_taken": 409,
    "cluster_mode": 409,
    "daemon_unreachable": 503,
    # the gateway
    "parse_error": 400,
    "statement_too_complex": 400,
    "multiple_statements": 400,
    "forbidden_statement": 400,
    "forbidden_function": 400,
    "unknown_table": 400,
    "unknown_column": 400,
    "invalid_operation": 400,
    "idempotency_key_required": 400,
    "read_only_violation": 400,
    "invalid_data": 400,
    "statement_timeout": 408,
    "result_too_large": 422,
    "idempotency_in_progress": 409,
    "outcome_unknown": 409,
    "constraint_violation": 409,
    "transaction_conflict": 409,
    "agent_frozen": 423,
    "pool_exhausted": 429,
    "too_many_approvals": 429,
    "analysis_busy": 429,
    "database_error": 500,
    "analysis_error": 500,
    "database_unavailable": 503,
}


def http_status(error: CorralError) -> int:
    """The HTTP status for ``error``.

    A :class:`RemoteError` keeps the status of the answer it stands for; the daemon's errors
    and the gateway's are looked up by code in :data:`STATUS`; any other error goes by family:
    ``rate_limited`` and ``pool_exhausted`` 429, a ``DaemonError`` or a ``UsageError`` 400,
    anything else 500.
    """
    if isinstance(error, RemoteError):
        return error.status
    if isinstance(error, DaemonError) or _is_gateway_error(error):
        status = STATUS.get(error.code)
        if status is not None:
            return status
    if error.code in {"rate_limited", "pool_exhausted"}:
        return 429
    if isinstance(error, DaemonError | UsageError):
        return 400
    return 500


def _is_gateway_error(error: CorralError) -> bool:
    # The gateway (and its drivers) is imported only when a database is opened: when its
    # errors module is not loaded, no GatewayError exists.
    module = sys.modules.get("corral.gateway._errors")
    return module is not None and isinstance(error, module.GatewayError)
