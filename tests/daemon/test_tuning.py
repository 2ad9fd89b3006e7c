"""``corral serve``'s interpreter settings (``daemon._tuning``)."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator

import pytest

from corral.daemon import _tuning


@pytest.fixture
def restored() -> Iterator[None]:
    thresholds, interval = gc.get_threshold(), sys.getswitchinterval()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)
    sys.setswitchinterval(interval)


@pytest.mark.usefixtures("restored")
def test_tune_freezes_what_exists_collects_less_often_and_hands_the_gil_over_sooner() -> None:
    kept = [object() for _ in range(10)]
    gc.unfreeze()
    _tuning.tune()
    assert gc.get_freeze_count() > len(kept)
    assert gc.get_threshold() == (_tuning.YOUNG_OBJECTS, _tuning.OLDER_EVERY, _tuning.OLDER_EVERY)
    assert _tuning.YOUNG_OBJECTS > 700  # CPython's default, which it replaces
    assert sys.getswitchinterval() == pytest.approx(_tuning.SWITCH_INTERVAL_S)
    assert _tuning.SWITCH_INTERVAL_S < 0.005  # CPython's default
