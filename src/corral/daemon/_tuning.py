"""The daemon process's interpreter settings, set by ``corral serve`` once it is up.

- Garbage collection: a daemon makes many small, short-lived objects for every event (dicts,
  events, futures) over a large heap of long-lived ones (every agent's record, the imported
  code). With CPython's default thresholds a collection runs every 700 net allocations,
  several times a turn, and each older-generation pass walks that heap again: about a tenth
  of a busy daemon's CPU. What exists once the daemon is up is frozen out of later
  collections, and the young generation is collected every :data:`YOUNG_OBJECTS`.
- The GIL's switch interval: the SQLite store commits on a thread of its own, which takes
  the GIL back after every SQLite call; while the event loop is busy, each of those waits
  for the loop to hand the GIL over, by default after up to 5 ms, so a commit of a few
  statements took tens of milliseconds (and every state change's event as long to be
  streamed). :data:`SWITCH_INTERVAL_S` bounds each wait.

A program that runs :func:`corral.daemon.serve` inside itself keeps its own settings.
"""

from __future__ import annotations

import gc
import sys

__all__ = ["OLDER_EVERY", "SWITCH_INTERVAL_S", "YOUNG_OBJECTS", "tune"]

YOUNG_OBJECTS = 20_000
"""Net allocations between two young collections (CPython's default: 700)."""
OLDER_EVERY = 20
"""Collections of a generation between two of the next (CPython's default: 10)."""
SWITCH_INTERVAL_S = 0.001
"""Seconds a thread holds the GIL while another waits for it (CPython's default: 0.005)."""


def tune() -> None:
    """Freeze every object that exists now (the loaded state, the imported modules: they are
    no longer walked by collections, and are still freed when nothing refers to them), and
    set the thresholds and the switch interval above. For the daemon's process once it has
    started; calling it again freezes what was made since."""
    gc.freeze()
    gc.set_threshold(YOUNG_OBJECTS, OLDER_EVERY, OLDER_EVERY)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
