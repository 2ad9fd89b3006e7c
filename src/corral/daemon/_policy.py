"""What happens after a failed turn: the failure policies and the circuit breaker.

Pure functions over an agent's record and spec, so every rule is testable on its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from corral.daemon._spec import AgentSpec

Action = Literal["retry", "hold", "fail"]

# Reasons an agent is held in ``blocked``.
ASK = "ask"
RETRIES_EXHAUSTED = "retries-exhausted"
CIRCUIT_TRIPPED = "circuit-tripped"
BUDGET_EXHAUSTED = "budget-exhausted"
WAKE_LIMIT = "wake-limit"  # woken too often in a minute (see corral.daemon._wake)


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    reason: str | None = None


def after_failure(record: Mapping[str, Any], spec: AgentSpec, failures: int) -> Decision:
    """Decide what a failed turn leads to; ``failures`` counts this one.

    The breaker comes first, whatever the policy: ``maxConsecutiveFailures`` failures in a row
    hold the agent (``circuit-tripped``), however they came (retries or people re-prompting).
    Then ``onFailure``: ``fail`` ends the agent; ``ask`` holds it; ``retry`` re-sends the same
    prompt up to ``maxRetries`` times and then holds it (``retries-exhausted``). ``retry``
    without ``maxRetries``, or with nothing to re-send, holds at once (``ask``) rather than
    loop.
    """
    if failures >= spec.max_consecutive_failures:
        return Decision("hold", CIRCUIT_TRIPPED)
    if spec.on_failure == "fail":
        return Decision("fail")
    if spec.on_failure == "ask":
        return Decision("hold", ASK)
    if spec.max_retries is None or not record.get("lastPrompt"):
        return Decision("hold", ASK)
    if record.get("retriesUsed", 0) < spec.max_retries:
        return Decision("retry")
    return Decision("hold", RETRIES_EXHAUSTED)
