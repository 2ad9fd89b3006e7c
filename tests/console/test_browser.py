"""The browser the console's tests use: the system's Chromium, headless, reaching a real
``corral serve`` over loopback."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page

from tests.support.browser import chromium_path, missing
from tests.support.serve_process import ServeProcess

pytestmark = pytest.mark.timeout(90)  # a daemon and a browser start here: seconds each


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    with ServeProcess(tmp_path_factory.mktemp("serve")) as served:
        yield served


def test_chromium_loads_a_real_daemons_health_page(daemon: ServeProcess, page: Page) -> None:
    answer = page.goto(f"{daemon.url}/healthz")
    assert answer is not None
    assert answer.status == 200
    assert json.loads(page.inner_text("body"))["status"] == "ok"
    assert page.viewport_size == {"width": 1280, "height": 800}
    assert "HeadlessChrome" in page.evaluate("navigator.userAgent")


def test_a_missing_chromium_skips_with_the_reason_but_fails_under_ci(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nowhere = str(tmp_path / "no-chromium")
    monkeypatch.setenv("CORRAL_CHROMIUM", nowhere)
    assert chromium_path() is None
    not_a_program = tmp_path / "chromium"
    not_a_program.write_text("#!/bin/sh\n")
    not_a_program.chmod(0o644)
    monkeypatch.setenv("CORRAL_CHROMIUM", str(not_a_program))
    assert chromium_path() is None

    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match="no Chromium"):
        missing("no Chromium here")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"no Chromium here; CI=true requires it"):
        missing("no Chromium here")
