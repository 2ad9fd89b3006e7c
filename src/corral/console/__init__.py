"""The console: a web page where people oversee their agents, served by the daemon itself
(``corral serve`` puts it in front of the HTTP API; ``corral console`` opens it).

Everything it shows comes from the daemon's API as the logged-in person sees it, and
everything it does goes through that same API, with that person's name on the record. See
docs/console.md.
"""

from corral.console._app import PREFIX, Console, is_console_path


def console_url(daemon_url: str) -> str:
    """The console's address on the daemon at ``daemon_url`` (its home page, ``/``)."""
    return daemon_url.rstrip("/") + "/"


__all__ = ["PREFIX", "Console", "console_url", "is_console_path"]
