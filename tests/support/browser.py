"""Headless Chromium for the console's tests: the system's browser (Debian's ``chromium``)
driven by Playwright for Python through ``executable_path``. No browser is ever downloaded
(``playwright install`` is not part of any setup): the browser is the machine's.

Where the browser is: ``CORRAL_CHROMIUM`` when set, else ``/usr/bin/chromium``, else
``chromium`` on the ``PATH``. When there is none the tests that need it are skipped with the
reason, except under ``CI=true``, where they fail: CI must not pass by skipping the browser
(``.ci/run`` installs ``chromium`` with apt when it is missing).

A ``conftest.py`` re-exports the fixtures::

    from tests.support.browser import browser, page

Every step a test takes in the page waits at most :data:`STEP_TIMEOUT_MS` (Playwright's
default timeout of the context): a bound, never a guess at how long it takes.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, ViewportSize, expect, sync_playwright

__all__ = [
    "STEP_TIMEOUT_MS",
    "VIEWPORT",
    "browser",
    "chromium_path",
    "missing",
    "page",
]

DEFAULT_CHROMIUM = "/usr/bin/chromium"
# The size the console must read well at (issue 14); screenshots are taken at it.
VIEWPORT: ViewportSize = {"width": 1280, "height": 800}
STEP_TIMEOUT_MS = 10_000  # any one step in the page (a click, an expectation); a bound only
LAUNCH_TIMEOUT_MS = 60_000  # starting Chromium on a loaded machine; a bound only

expect.set_options(timeout=STEP_TIMEOUT_MS)  # expectations too, not only actions


def chromium_path() -> str | None:
    """The system's Chromium, or None when this machine has none."""
    named = os.environ.get("CORRAL_CHROMIUM")
    if named:
        return named if _runnable(named) else None
    if _runnable(DEFAULT_CHROMIUM):
        return DEFAULT_CHROMIUM
    return shutil.which("chromium")


def _runnable(path: str) -> bool:
    return Path(path).is_file() and os.access(path, os.X_OK)


def missing(message: str) -> None:
    """Skip the test saying why, or fail it under ``CI=true``."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message}; CI=true requires it (.ci/run installs it)", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Headless Chromium, one per test module (it takes a second or two to start)."""
    path = chromium_path()
    if path is None:
        where = os.environ.get("CORRAL_CHROMIUM") or DEFAULT_CHROMIUM
        missing(
            f"no Chromium at {where!r} (CORRAL_CHROMIUM) nor on the PATH: "
            "`apt-get install chromium` to run the console's browser tests"
        )
        raise AssertionError("unreachable")  # pragma: no cover: skip and fail raise
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=path, headless=True, timeout=LAUNCH_TIMEOUT_MS
        )
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh page at 1280x800 in a context of its own (no cookies from another test)."""
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(STEP_TIMEOUT_MS)
    context.set_default_navigation_timeout(STEP_TIMEOUT_MS)
    try:
        yield context.new_page()
    finally:
        context.close()
