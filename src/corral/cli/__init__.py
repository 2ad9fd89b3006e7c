"""The ``corral`` command: run the daemon, and talk to a running one over HTTP.

Every command but ``serve`` talks to the daemon at ``--url`` (default
http://127.0.0.1:4600, or ``CORRAL_URL``) with the bearer ``--token`` (or ``CORRAL_TOKEN``).
A refusal prints ``error <code>: <message>`` on stderr and exits 2 for a usage error or a
4xx answer, 1 otherwise. Needs the ``daemon`` extra (typer, rich): ``pip install
'corral[daemon]'``.
"""

# Importing this package costs no typer, rich or httpx: ``main`` reports a missing extra
# instead of a traceback, and ``build_app`` imports the command modules when called.
from corral.cli._app import INSTALL_HINT, build_app, main
from corral.cli._calls import DEFAULT_URL, exit_code

__all__ = ["DEFAULT_URL", "INSTALL_HINT", "build_app", "exit_code", "main"]
