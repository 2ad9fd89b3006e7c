"""``python -m corral.cli``: the ``corral`` command."""

from corral.cli._app import main

main()
