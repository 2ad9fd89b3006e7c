"""The daemon process's garbage collector: what exists once the daemon is up is frozen out of
later collections, and the young generation is collected less often.

A daemon makes many small, short-lived objects for every event (dicts, events, futures) over
a large heap of long-lived ones (every agent's record, the imported code). With CPython's
default thresholds a collection runs every 700 net allocations, several times a turn, and
each older-generation pass walks that heap again: about a tenth of a busy daemon's CPU
(docs/benchmarks.md). Set by ``corral serve`` for its own process only; a program that runs
:func:`corral.daemon.serve` inside itself keeps its own settings.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_OBJECTS", "tune"]

YOUNG_OBJECTS = 20_000
"""Net allocations between two young collections (CPython's default: 700)."""
OLDER_EVERY = 20
"""Collections of a generation between two of the next (CPython's default: 10)."""


def tune() -> None:
    """Freeze every object that exists now (the loaded state, the imported modules: they are
    no longer walked by collections, and are still freed when nothing refers to them) and set
    the thresholds above. Meant for the daemon's process once it has started; calling it
    again freezes what was made since."""
    gc.freeze()
    gc.set_threshold(YOUNG_OBJECTS, OLDER_EVERY, OLDER_EVERY)
