"""corral: supervision for AI agents.

The public surface lives in the layer packages: ``corral.kernel`` (contracts),
``corral.runtime`` (working primitives) and ``corral.agent`` (a supervised agent loop).
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
