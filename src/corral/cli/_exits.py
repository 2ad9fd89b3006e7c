"""What the exit status of a ``corral`` command says: one mapping from the daemon's typed
error (its code, its ``retryable`` flag, its HTTP status) to a status a script can act on.
docs/daemon.md ("Exit codes") has the table; keep the two the same.

Imports nothing heavy: ``corral.cli`` exports :func:`exit_code`.
"""

from corral.kernel import CorralError, UsageError

OK = 0
FAILED = 1  # the daemon failed (5xx) or answered what the command did not expect
BAD_INPUT = 2  # a usage error (typer's are 2 too), an invalid argument, spec or request
NOT_FOUND = 3  # no such agent, run, decision, token or database (404)
CONFLICT = 4  # refused in its current state; the same command will not pass later (409, 423)
UNREACHABLE = 69  # EX_UNAVAILABLE: no daemon answers at --url
TRY_AGAIN = 75  # EX_TEMPFAIL: refused for now, the same command may pass later (retryable)
NOT_ALLOWED = 77  # EX_NOPERM: no valid token, or beyond what the token may do (401, 403)
READER_GONE = 141  # the reader of the output went away (128 + SIGPIPE)


def exit_code(error: CorralError) -> int:
    """The exit status for ``error``: unreachable, then retryable, then by HTTP status (a
    usage error without one is bad input), anything else 1."""
    from corral.daemon._status import http_status

    if error.code == "daemon_unreachable":
        return UNREACHABLE
    if error.retryable:
        return TRY_AGAIN
    status = http_status(error)
    if status in (401, 403):
        return NOT_ALLOWED
    if status == 404:
        return NOT_FOUND
    if status in (409, 423):
        return CONFLICT
    if isinstance(error, UsageError) or 400 <= status < 500:
        return BAD_INPUT
    return FAILED
