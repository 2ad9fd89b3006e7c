"""Driving the console in a browser: logging in, where the screenshots go, and a site on
another origin (for forged cross-site requests).

Screenshots: every page the browser tests visit is saved as a PNG at 1280x800 under a
fixed name. They go to ``CORRAL_CONSOLE_SCREENSHOTS`` when it is set (``make screenshots``
sets it to ``docs/console``, whose images docs/console.md shows), else to the test's
temporary directory, so that running the suite never rewrites files of the work tree.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from playwright.sync_api import Page, expect

from tests.support.http_server import serving

__all__ = ["login", "other_origin", "screenshot_dir", "shoot"]

SCREENSHOTS_ENV = "CORRAL_CONSOLE_SCREENSHOTS"


def login(page: Page, url: str, token: str) -> None:
    """Log in at ``url``'s console with ``token`` and land on "Waiting on you"."""
    page.goto(f"{url}/console/login")
    page.get_by_test_id("login-token").fill(token)
    page.get_by_test_id("login-submit").click()
    expect(page.get_by_test_id("page-waiting")).to_be_visible()


def wait_live(page: Page) -> None:
    """Until the page's live stream has said hello (changes after this reach the page)."""
    expect(page.locator("body[data-seq]")).to_have_count(1)
    expect(page.get_by_test_id("live-status")).to_have_text("live")


def screenshot_dir(fallback: Path) -> Path:
    """Where screenshots go: ``CORRAL_CONSOLE_SCREENSHOTS``, else ``fallback``."""
    named = os.environ.get(SCREENSHOTS_ENV)
    where = Path(named) if named else fallback
    where.mkdir(parents=True, exist_ok=True)
    return where


def shoot(page: Page, where: Path, name: str) -> Path:
    """The viewport (1280x800) as ``<where>/<name>.png``; the path."""
    path = where / f"{name}.png"
    page.screenshot(path=str(path), type="png", animations="disabled", caret="hide")
    return path


class _OneHtmlPage(BaseHTTPRequestHandler):
    html = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(self.html)))
        self.end_headers()
        self.wfile.write(self.html)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: nothing on the test's stderr."""


@contextmanager
def other_origin(html: str) -> Iterator[str]:
    """A site on another port of 127.0.0.1 (another origin, the same site as the console's,
    so SameSite cookies are sent to the console from it) serving ``html`` at every path;
    yields its URL."""
    handler = type("Page", (_OneHtmlPage,), {"html": html.encode()})
    with serving(handler, "other-origin") as url:
        yield url
