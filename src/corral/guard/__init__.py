"""corral.guard: may this agent do this?

A :class:`Supervisor` asks its guardrails, in order, about an action an agent wants to take;
:class:`HumanApproval` is a guardrail that puts matching actions to a person. Both answer with
a :class:`GuardrailResult`. :class:`AgentGroup` holds the agents a supervisor answers for.
"""

from corral.guard._approval import ApprovalRequest, HumanApproval, OnRequest
from corral.guard._group import AgentGroup
from corral.guard._result import Guardrail, GuardrailResult, GuardrailWarning, Severity
from corral.guard._supervisor import Supervisor
from corral.kernel import UnknownAgentError  # re-exported: the one class for every layer

__all__ = [
    "AgentGroup",
    "ApprovalRequest",
    "Guardrail",
    "GuardrailResult",
    "GuardrailWarning",
    "HumanApproval",
    "OnRequest",
    "Severity",
    "Supervisor",
    "UnknownAgentError",
]
