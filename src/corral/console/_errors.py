"""The console's own refusals (their HTTP statuses are in corral.daemon._status)."""

from __future__ import annotations

from corral.daemon._errors import DaemonError


class LoginRefusedError(DaemonError):
    """A token that may not open the console: unknown, revoked, or an agent's."""

    code = "login_refused"

    def __init__(self, why: str) -> None:
        super().__init__(f"login refused: {why}", why=why)


class SessionRequiredError(DaemonError):
    """A console request without a live session (never logged in, logged out, expired, or
    its token revoked)."""

    code = "session_required"

    def __init__(self) -> None:
        super().__init__("log in to the console first (no live session for this request)")


class CsrfRefusedError(DaemonError):
    """A state-changing console request without its session's form token, or with a wrong
    one: it changes nothing."""

    code = "csrf_refused"

    def __init__(self, why: str) -> None:
        super().__init__(f"request refused as a possible cross-site forgery: {why}", why=why)


class FormInvalidError(DaemonError):
    """A console form that cannot be read: too large, or a field missing or too long."""

    code = "form_invalid"

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"form field {field!r}: {problem}", field=field, problem=problem)
