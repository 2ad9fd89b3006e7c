"""corral: supervision for AI agents.

The public surface lives in the layer packages: ``corral.kernel`` (contracts),
``corral.runtime`` (working primitives) and ``corral.agent`` (a supervised agent loop).
``corral.connect`` (``corral.client.connect``) connects a process of its own to the daemon;
it is imported on first use, so ``import corral`` stays free of httpx.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corral.client import connect

__version__ = "0.1.0"

__all__ = ["__version__", "connect"]


def __getattr__(name: str) -> Any:
    # The client is imported when it is first asked for (PEP 562), not by ``import corral``.
    if name == "connect":
        from corral.client import connect

        return connect
    raise AttributeError(f"module 'corral' has no attribute {name!r}")
