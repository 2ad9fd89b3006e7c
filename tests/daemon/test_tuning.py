"""``corral serve``'s garbage-collector settings (``daemon._gc``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from corral.daemon import _gc


@pytest.fixture
def restored() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("restored")
def test_tune_freezes_what_exists_and_collects_young_objects_less_often() -> None:
    kept = [object() for _ in range(10)]
    gc.unfreeze()
    _gc.tune()
    assert gc.get_freeze_count() > len(kept)
    assert gc.get_threshold() == (_gc.YOUNG_OBJECTS, _gc.OLDER_EVERY, _gc.OLDER_EVERY)
    assert _gc.YOUNG_OBJECTS > 700  # CPython's default, which it replaces
