"""The harnesses: the seam that runs one turn of an agent, and its implementations (``external``
runs nothing: it waits for the agent's own process to report its turns)."""

from corral.daemon.harnesses._base import (
    AdoptingHarness,
    ExtraTool,
    Harness,
    NothingToAdoptError,
    TerminatingHarness,
    TurnFailedError,
    TurnRequest,
    TurnResult,
    WarmHarness,
)
from corral.daemon.harnesses._command import CommandHarness
from corral.daemon.harnesses._external import ExternalHarness
from corral.daemon.harnesses._openai import OpenAIHarness
from corral.daemon.harnesses._python import PythonHarness, TurnContext
from corral.daemon.harnesses._timer import TurnTimer

__all__ = [
    "AdoptingHarness",
    "CommandHarness",
    "ExternalHarness",
    "ExtraTool",
    "Harness",
    "NothingToAdoptError",
    "OpenAIHarness",
    "PythonHarness",
    "TerminatingHarness",
    "TurnContext",
    "TurnFailedError",
    "TurnRequest",
    "TurnResult",
    "TurnTimer",
    "WarmHarness",
]
