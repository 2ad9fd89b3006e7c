"""The console's tests run in a real browser: headless Chromium (tests/support/browser.py)
against a real ``corral serve`` (tests/support/serve_process.py)."""

from tests.support.browser import browser, page

__all__ = ["browser", "page"]
