"""A python-harness function for the session tests: ``tests.daemon.workers.session_funcs:echo``."""

from __future__ import annotations

import json

from corral.daemon import TurnContext


def echo(prompt: str, context: TurnContext) -> str:
    """The prompt and the session the turn was given, as JSON."""
    return json.dumps({"prompt": prompt, "session": list(context.session)})
