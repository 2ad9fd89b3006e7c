"""Requests to the daemon: JSON in, JSON out, its refusals as typed errors, a daemon that
does not answer (or answers it is unavailable) asked again for a while."""

from __future__ import annotations

import logging
from typing import Any

import httpx

from corral.client._errors import DaemonRefusedError, DaemonUnreachableError
from corral.kernel import Clock

logger = logging.getLogger("corral.client")

Json = dict[str, Any]

_RETRY_FIRST_S = 0.25  # then doubling, up to _RETRY_MAX_S between tries
_RETRY_MAX_S = 4.0


class Wire:
    """One daemon at ``url``, with ``token`` as its bearer. ``timeout_s`` bounds each
    request's wait for an answer (beyond what the request itself asks the daemon to wait);
    ``retry_s`` is how long a request that may be repeated is tried again while the daemon
    does not answer or answers that it is unavailable (503, retryable)."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout_s: float,
        retry_s: float,
        clock: Clock,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.clock = clock
        self.http = httpx.AsyncClient(
            base_url=self.url,
            headers={"authorization": f"Bearer {token}"},
            timeout=timeout_s,
            transport=transport,
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    async def call(
        self,
        method: str,
        path: str,
        *,
        body: Json | None = None,
        params: dict[str, str] | None = None,
        waits_s: float = 0.0,
        retry: bool = False,
        retry_codes: frozenset[str] = frozenset(),
    ) -> tuple[int, Json]:
        """The daemon's answer to ``method path`` (``body`` as JSON): its status and JSON
        object. ``waits_s``: how long the daemon may hold the request by design (a wait for
        a person), on top of ``timeout_s``. ``retry``: the request may be sent again (it is
        idempotent) while the daemon is unreachable or unavailable -- or refuses with one of
        ``retry_codes``, retryable ones -- for up to ``retry_s``.
        Raises :class:`DaemonRefusedError` for a refusal, :class:`DaemonUnreachableError`
        when no daemon answered."""
        delay_s, started = _RETRY_FIRST_S, self.clock.monotonic()
        while True:
            try:
                return await self._once(method, path, body, params, waits_s)
            except (DaemonUnreachableError, DaemonRefusedError) as exc:
                unavailable = isinstance(exc, DaemonUnreachableError) or (
                    exc.retryable and (getattr(exc, "status", 0) == 503 or exc.code in retry_codes)
                )
                left = self.retry_s - (self.clock.monotonic() - started)
                if not (retry and unavailable) or left <= 0:
                    raise
                logger.warning("%s %s: %s; trying again in %g s", method, path, exc, delay_s)
            await self.clock.sleep(min(delay_s, max(left, 0.0)))
            delay_s = min(delay_s * 2, _RETRY_MAX_S)

    async def _once(
        self,
        method: str,
        path: str,
        body: Json | None,
        params: dict[str, str] | None,
        waits_s: float,
    ) -> tuple[int, Json]:
        try:
            answer = await self.http.request(
                method, path, json=body, params=params, timeout=self.timeout_s + waits_s
            )
        except httpx.HTTPError as exc:
            raise DaemonUnreachableError(self.url, f"{type(exc).__name__}: {exc}") from None
        try:
            data = answer.json()
        except ValueError:
            data = None
        if answer.status_code >= 400:
            raise refusal(answer.status_code, data, answer.text)
        if not isinstance(data, dict):
            raise DaemonRefusedError(
                "bad_answer",
                f"the daemon answered {method} {path} with no JSON object "
                f"(HTTP {answer.status_code}): {answer.text[:200]!r}",
                status=answer.status_code,
            )
        return answer.status_code, data


def refusal(status: int, data: Any, text: str) -> DaemonRefusedError:
    """The error an HTTP error answer stands for (``{"error": {code, message, retryable,
    details}}``; anything else as ``http_<status>``)."""
    err = data.get("error") if isinstance(data, dict) else None
    if not isinstance(err, dict) or not isinstance(err.get("code"), str):
        return DaemonRefusedError(
            f"http_{status}", f"the daemon answered HTTP {status}: {text[-300:]}", status=status
        )
    details = err.get("details")
    return DaemonRefusedError(
        err["code"],
        str(err.get("message") or err["code"]),
        status=status,
        retryable=bool(err.get("retryable", False)),
        details={
            k: v
            for k, v in (details if isinstance(details, dict) else {}).items()
            if k not in ("message", "retryable", "status")
        },
    )
