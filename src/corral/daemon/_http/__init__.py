"""The daemon's HTTP API (FastAPI): routes as data in ``_agents`` and ``_gateway``, what they
share in ``_common``, the app and its gate in ``_app``. See docs/daemon.md for the API."""

from corral.daemon._auth import is_loopback_host
from corral.daemon._http._app import create_app

__all__ = ["create_app", "is_loopback_host"]
