"""corral.integrations: corral's supervision inside agents written with other frameworks.

:class:`Oversight` holds what corral adds (guardrails and approvals before tool calls, budgets
in tokens, dollars, turns and time, cancellation, the gateway as tools); the adapters
``corral.integrations.pydantic_ai``, ``.openai_agents`` and ``.langchain`` put it into their
framework's hooks. Importing this package imports no framework. The manual is
docs/integrations.md.
"""

from corral.integrations._oversight import (
    ActionChecker,
    ConnectedAgent,
    GatewayTool,
    Oversight,
    QueryGateway,
)

__all__ = ["ActionChecker", "ConnectedAgent", "GatewayTool", "Oversight", "QueryGateway"]
