"""Where the console's tests find a browser, and what they do without one (the browser
itself is tried against a real daemon in test_console_browser.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.browser import chromium_path, missing


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
