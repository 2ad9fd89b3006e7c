"""The ``corral`` command: run the daemon, and talk to a running one over HTTP (``--url``,
``--token``; refusals and exit codes as docs/daemon.md says). Needs the ``daemon`` extra."""

# Importing this package costs no typer, rich or httpx: ``main`` reports a missing extra
# instead of a traceback, and ``build_app`` imports the command modules when called.
from corral.cli._app import INSTALL_HINT, build_app, main
from corral.cli._calls import DEFAULT_URL
from corral.cli._exits import exit_code

__all__ = ["DEFAULT_URL", "INSTALL_HINT", "build_app", "exit_code", "main"]
