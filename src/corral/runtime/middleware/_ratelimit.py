"""``TenantRateLimit``: a token bucket per tenant; over the limit is refused, never waited."""

from __future__ import annotations

from collections.abc import Iterable

from corral.kernel import SYSTEM_CLOCK, Clock, MiddlewareStage, RateLimitedError
from corral.kernel import _validate as v
from corral.runtime.middleware._pipeline import CallNext, MiddlewareContext, stage_set

DEFAULT_TENANT = "default"

# Above this many buckets, full ones (idle tenants) are dropped: a full bucket and no bucket
# behave the same, so forgetting them changes nothing but memory.
_PRUNE_ABOVE = 4096


class TenantRateLimit:
    """Allows each tenant ``rate_per_s`` calls per second on average, ``burst`` at once.

    The tenant is ``ctx.meta.tenant_id`` (``"default"`` when None). Each tenant has a bucket
    of ``burst`` tokens refilled at ``rate_per_s`` on ``clock``; a call takes one token. With
    none left the call is refused at once with ``RateLimitedError`` (retryable), whose
    ``retry_after_s`` says when a token will be there; the limiter never waits. Runs at
    ``stages`` (CHAT by default).
    """

    __slots__ = ("_buckets", "burst", "clock", "rate_per_s", "stages")

    def __init__(
        self,
        rate_per_s: float,
        burst: int,
        *,
        stages: Iterable[MiddlewareStage] = frozenset({MiddlewareStage.CHAT}),
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        v.positive_number("TenantRateLimit", "rate_per_s", rate_per_s)
        v.positive_int("TenantRateLimit", "burst", burst)
        self.rate_per_s = float(rate_per_s)
        self.burst = burst
        self.stages = stage_set("TenantRateLimit", "stages", stages)
        v.instance_of("TenantRateLimit", "clock", clock, Clock)
        self.clock = clock
        # tenant -> (tokens, monotonic time they were counted)
        self._buckets: dict[str, tuple[float, float]] = {}

    def available(self, tenant: str | None = None) -> float:
        """The tokens ``tenant`` has now (``burst`` for a tenant never seen)."""
        v.non_empty_str("TenantRateLimit.available", "tenant", tenant, optional=True)
        return self._refill(tenant or DEFAULT_TENANT, self.clock.monotonic())

    def _refill(self, tenant: str, now: float) -> float:
        bucket = self._buckets.get(tenant)
        if bucket is None:
            return float(self.burst)
        tokens, at = bucket
        return min(float(self.burst), tokens + (now - at) * self.rate_per_s)

    def acquire(self, tenant: str | None = None) -> None:
        """Take one token for ``tenant`` or raise ``RateLimitedError``."""
        v.non_empty_str("TenantRateLimit.acquire", "tenant", tenant, optional=True)
        name = tenant or DEFAULT_TENANT
        now = self.clock.monotonic()
        tokens = self._refill(name, now)
        if tokens < 1.0 - 1e-9:  # float drift must not refuse a token that is due
            self._buckets[name] = (tokens, now)
            raise RateLimitedError(
                name, self.rate_per_s, self.burst, max(0.0, 1.0 - tokens) / self.rate_per_s
            )
        if len(self._buckets) > _PRUNE_ABOVE:
            self._prune(now)
        self._buckets[name] = (max(0.0, tokens - 1.0), now)

    def _prune(self, now: float) -> None:
        full = [t for t in self._buckets if self._refill(t, now) >= self.burst]
        for tenant in full:
            del self._buckets[tenant]

    async def process(self, ctx: MiddlewareContext, call_next: CallNext) -> None:
        self.acquire(ctx.meta.tenant_id)
        await call_next()

    def __repr__(self) -> str:
        return (
            f"TenantRateLimit(rate_per_s={self.rate_per_s:g}, burst={self.burst}, "
            f"stages={sorted(self.stages)})"
        )
