"""``HumanApproval``: a guardrail that asks a person before matching actions go on."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from corral.guard._result import GuardrailResult
from corral.kernel import SYSTEM_CLOCK, Clock, InvalidArgumentError, TimerHandle
from corral.kernel import _validate as v

logger = logging.getLogger("corral.guard.approval")

_EMPTY_CONTEXT: Mapping[str, object] = MappingProxyType({})
_ALLOW = GuardrailResult.allow()


@dataclass(frozen=True, slots=True, eq=False)
class ApprovalRequest:
    """One question to a person: may ``agent_id`` do ``action`` (with ``context``)?

    Answer by completing ``approval``: True allows, False blocks. :meth:`approve`,
    :meth:`deny` and :meth:`resolve` do it safely from any thread and ignore answers that come
    after the first (or after the request timed out or was withdrawn); setting the future
    directly is only safe from the event loop's thread.
    """

    agent_id: str
    action: str
    context: Mapping[str, object]
    approval: asyncio.Future[bool]

    def resolve(self, allowed: bool) -> None:
        """Answer ``allowed`` from any thread. Only the first answer counts."""
        v.instance_of("ApprovalRequest.resolve", "allowed", allowed, bool)
        if self.approval.done():
            return  # answered, timed out or withdrawn already
        loop = self.approval.get_loop()
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            _settle(self.approval, allowed)
            return
        try:
            loop.call_soon_threadsafe(_settle, self.approval, allowed)
        except RuntimeError:
            # The loop has closed, so nobody waits for this answer any more.
            if not loop.is_closed():
                raise

    def approve(self) -> None:
        """``resolve(True)``."""
        self.resolve(True)

    def deny(self) -> None:
        """``resolve(False)``."""
        self.resolve(False)

    @property
    def answered(self) -> bool:
        return self.approval.done()


OnRequest = Callable[[ApprovalRequest], "object | Awaitable[object]"]


class HumanApproval:
    """A guardrail that puts matching actions to a person.

    An action matches when it contains one of the patterns, ignoring case (``deploy`` matches
    ``Redeploy-cache``), or when ``matches`` (optional, called with the action) answers true;
    other actions are allowed at once. ``matches`` raising makes :meth:`check` raise (a
    supervisor counts that as a block). For a matching action
    ``on_request`` is called (plain or async) with an :class:`ApprovalRequest`, then the
    request's ``approval`` future is awaited without blocking the event loop or any thread:

    - True allows; False blocks; any other answer blocks (fails closed).
    - ``on_request`` raising, the future failing or being cancelled: blocked.
    - With ``timeout_s`` (seconds on ``clock``, covering the callback and the answer), no
      answer in time blocks with a reason that says it timed out after ``timeout_s`` s; the
      request's future is then cancelled so a late answer changes nothing.
    - If the waiting task itself is cancelled, the cancellation propagates and the request is
      withdrawn (its future cancelled).

    Raises ``InvalidArgumentError`` for patterns that are not non-empty strings (a single
    string is refused: pass a set), a non-callable ``on_request`` or ``matches``, an empty
    ``name`` or a ``timeout_s`` that is not a finite number > 0.
    """

    __slots__ = (
        "_clock",
        "_lock",
        "_match",
        "_name",
        "_on_request",
        "_patterns",
        "_pending",
        "_timeout_s",
    )

    def __init__(
        self,
        patterns: Iterable[str],
        on_request: OnRequest,
        *,
        name: str = "hitl-approval",
        timeout_s: float | None = None,
        clock: Clock = SYSTEM_CLOCK,
        matches: Callable[[str], bool] | None = None,
    ) -> None:
        where = "HumanApproval"
        if isinstance(patterns, str | bytes) or not isinstance(patterns, Iterable):
            raise InvalidArgumentError(where, "patterns", "an iterable of strings", patterns)
        folded: dict[str, None] = {}
        for pattern in patterns:
            v.non_empty_str(where, "patterns[]", pattern)
            folded[pattern.casefold()] = None
        v.callable_(where, "on_request", on_request)
        v.non_empty_str(where, "name", name)
        v.positive_number(where, "timeout_s", timeout_s, optional=True)
        v.instance_of(where, "clock", clock, Clock)
        if matches is not None:
            v.callable_(where, "matches", matches)
        self._match = matches
        self._patterns: tuple[str, ...] = tuple(folded)
        self._on_request = on_request
        self._name = name
        self._timeout_s = timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: dict[int, ApprovalRequest] = {}

    @property
    def name(self) -> str:
        return self._name

    @property
    def timeout_s(self) -> float | None:
        return self._timeout_s

    @property
    def patterns(self) -> frozenset[str]:
        """The patterns, case-folded."""
        return frozenset(self._patterns)

    @property
    def pending(self) -> list[ApprovalRequest]:
        """The requests waiting for an answer now, oldest first."""
        with self._lock:
            return list(self._pending.values())

    def add_pattern(self, pattern: str) -> None:
        """Match ``pattern`` too (ignoring case). Adding a present pattern does nothing."""
        v.non_empty_str("HumanApproval.add_pattern", "pattern", pattern)
        folded = pattern.casefold()
        with self._lock:
            if folded not in self._patterns:
                self._patterns = (*self._patterns, folded)

    def remove_pattern(self, pattern: str) -> bool:
        """Stop matching ``pattern`` (ignoring case); whether it was there."""
        v.non_empty_str("HumanApproval.remove_pattern", "pattern", pattern)
        folded = pattern.casefold()
        with self._lock:
            kept = tuple(p for p in self._patterns if p != folded)
            removed = len(kept) != len(self._patterns)
            self._patterns = kept
        return removed

    def matches(self, action: str) -> bool:
        """Whether ``action`` contains one of the patterns, ignoring case, or the ``matches``
        given at construction answers true for it (whatever it raises propagates)."""
        folded = action.casefold()
        if any(pattern in folded for pattern in self._patterns):
            return True
        return self._match is not None and bool(self._match(action))

    async def check(
        self, agent_id: str, action: str, context: Mapping[str, object] | None = None
    ) -> GuardrailResult:
        """Allow at once, or ask a person and wait; see the class for every outcome."""
        if type(action) is not str:
            v.instance_of("HumanApproval.check", "action", action, str)
        if not self.matches(action):
            return _ALLOW
        v.non_empty_str("HumanApproval.check", "agent_id", agent_id)
        loop = asyncio.get_running_loop()
        approval: asyncio.Future[bool] = loop.create_future()
        request = ApprovalRequest(
            agent_id, action, _EMPTY_CONTEXT if context is None else context, approval
        )
        expired: asyncio.Future[None] | None = None
        timer: TimerHandle | None = None
        if self._timeout_s is not None:
            expired = loop.create_future()
            timer = self._clock.call_later(
                self._timeout_s, functools.partial(_settle, expired, None)
            )
        key = id(request)
        with self._lock:
            self._pending[key] = request
        try:
            return await self._await_answer(request, expired)
        finally:
            if timer is not None:
                timer.cancel()
            if not approval.done():
                approval.cancel()
            with self._lock:
                self._pending.pop(key, None)

    async def _await_answer(
        self, request: ApprovalRequest, expired: asyncio.Future[None] | None
    ) -> GuardrailResult:
        action = request.action
        try:
            outcome = self._on_request(request)
        except Exception as exc:
            logger.exception(
                "approval request for agent %r, action %r failed", request.agent_id, action
            )
            return GuardrailResult.blocked(f"Approval request for action {action!r} failed: {exc}")
        if inspect.isawaitable(outcome):
            task = asyncio.ensure_future(outcome)
            try:
                await _first(task, expired)
            except BaseException:
                task.cancel()
                raise
            if not task.done():
                task.cancel()
                return self._timed_out(request)
            if task.cancelled():
                return GuardrailResult.blocked(
                    f"Approval request for action {action!r} was cancelled"
                )
            error = task.exception()
            if error is not None:
                logger.error(
                    "approval request for agent %r, action %r failed",
                    request.agent_id,
                    action,
                    exc_info=error,
                )
                return GuardrailResult.blocked(
                    f"Approval request for action {action!r} failed: {error}"
                )
        approval = request.approval
        if not approval.done():
            await _first(approval, expired)
            if not approval.done():
                return self._timed_out(request)
        if approval.cancelled():
            return GuardrailResult.blocked(f"Approval for action {action!r} was cancelled")
        error = approval.exception()
        if error is not None:
            return GuardrailResult.blocked(f"Approval for action {action!r} failed: {error}")
        answer: Any = approval.result()
        if answer is True:
            return _ALLOW
        if answer is False:
            return GuardrailResult.blocked(f"Approval for action {action!r} was denied")
        return GuardrailResult.blocked(
            f"Approval for action {action!r} answered {answer!r}, not True or False"
        )

    def _timed_out(self, request: ApprovalRequest) -> GuardrailResult:
        logger.warning(
            "approval for agent %r, action %r timed out after %g s",
            request.agent_id,
            request.action,
            self._timeout_s,
        )
        return GuardrailResult.blocked(
            f"Approval for action {request.action!r} timed out after {self._timeout_s:g} s "
            "without an answer"
        )

    def __repr__(self) -> str:
        return (
            f"HumanApproval(name={self._name!r}, patterns={sorted(self._patterns)!r}, "
            f"timeout_s={self._timeout_s!r}"
            + ("" if self._match is None else f", matches={self._match!r}")
            + ")"
        )


def _settle(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


async def _first(future: asyncio.Future[Any], expired: asyncio.Future[None] | None) -> None:
    """Wait until ``future`` or ``expired`` is done; neither is cancelled by the wait."""
    if expired is None:
        await asyncio.wait((future,))
    else:
        await asyncio.wait((future, expired), return_when=asyncio.FIRST_COMPLETED)
