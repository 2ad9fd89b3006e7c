"""Signs of life a harness sees in files: the agent's heartbeat file, a command's output.

Every ``command`` and ``python`` turn has a heartbeat file, ``<state_dir>/heartbeat``, made
empty by the harness when the turn starts (:func:`alive`) and kept for the agent's next turns
(made anew only when the agent put something else in its place, see ``_state_files``); the
agent is told its path (``CORRAL_HEARTBEAT_FILE``) and shows it is alive by touching it (its
modification time or size changing). When the daemon watches the turn
(``TurnRequest.heartbeat``), :func:`watching` looks at the file -- and at the other files the
harness names, a command's output -- a few times per ``heartbeatS`` and calls ``heartbeat()``
when one changed.

Files are looked at with ``lstat``: a link the agent put in place of its file is not followed.
What the agent does to its files can only keep its own turn alive or let it stall.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

from corral.daemon.harnesses import _state_files
from corral.daemon.harnesses._base import TurnRequest

logger = logging.getLogger("corral.daemon")

HEARTBEAT_FILE = "heartbeat"
HEARTBEAT_ENV = "CORRAL_HEARTBEAT_FILE"
MIN_POLL_S = 0.02
MAX_POLL_S = 1.0

_Fingerprint = tuple[int, int, int] | None


def heartbeat_path(state_dir: Path) -> Path:
    """The agent's heartbeat file: in its state directory, outside its working directory."""
    if state_dir.is_absolute():
        return _absolute_heartbeat_path(state_dir)  # the same whatever the current directory
    return Path(os.path.abspath(state_dir / HEARTBEAT_FILE))


@functools.lru_cache(maxsize=4096)
def _absolute_heartbeat_path(state_dir: Path) -> Path:
    return Path(os.path.abspath(state_dir / HEARTBEAT_FILE))


def prepare(path: Path) -> None:
    """Make the turn's heartbeat file ``path`` an empty file (the one the last turn left when
    it is still a regular file of its own; whatever else the agent left in its place is
    removed first: :func:`_state_files.made_empty`).

    Best effort: a file that cannot be made is logged, and the agent is still told the path
    (touching it then fails on the agent's side, and its turn may stall)."""
    try:
        _state_files.made_empty(path)
    except OSError as exc:  # (a directory the agent put there, say)
        logger.warning("could not make the heartbeat file %s: %s", path, exc)


@contextlib.asynccontextmanager
async def alive(request: TurnRequest, others: Sequence[Path] = ()) -> AsyncIterator[Path]:
    """The turn's heartbeat file (:func:`heartbeat_path`, made by :func:`prepare`; its path
    is given) for the block, watched with ``others`` (see :func:`watching`); it is left in
    place when the block ends, for the agent's next turn (:func:`discard` removes it)."""
    path = heartbeat_path(request.state_dir)
    prepare(path)
    async with watching(request, [path, *others]):
        yield path


def discard(state_dir: Path) -> None:
    """Remove the agent's heartbeat file (kept between its turns; a turn its daemon died
    in is not watched when taken up again)."""
    _remove(heartbeat_path(state_dir))


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def poll_s(heartbeat_s: float) -> float:
    """How often the files of a turn with ``heartbeat_s`` are looked at: four times per
    ``heartbeat_s``, between :data:`MIN_POLL_S` and :data:`MAX_POLL_S` seconds apart."""
    return min(MAX_POLL_S, max(MIN_POLL_S, heartbeat_s / 4))


@contextlib.asynccontextmanager
async def watching(request: TurnRequest, paths: Sequence[Path]) -> AsyncIterator[None]:
    """While the block runs, call ``request.heartbeat()`` whenever one of ``paths`` changed
    (modification time, size or inode) since it was last looked at, every
    :func:`poll_s` seconds. Nothing is watched when the request has no ``heartbeat`` or its
    spec no ``heartbeatS``."""
    beat = request.heartbeat
    heartbeat_s = request.spec.heartbeat_s
    if beat is None or heartbeat_s is None or not paths:
        yield
        return
    task = asyncio.create_task(_poll(tuple(paths), beat, poll_s(heartbeat_s)))
    try:
        yield
    finally:
        task.cancel()
        await asyncio.wait({task})


async def _poll(paths: tuple[Path, ...], beat: Callable[[], None], every_s: float) -> None:
    seen = [_fingerprint(p) for p in paths]
    while True:
        await asyncio.sleep(every_s)
        changed = False
        for i, path in enumerate(paths):
            now = _fingerprint(path)
            if now != seen[i]:
                seen[i] = now
                changed = True
        if changed:
            try:
                beat()
            except Exception:  # the daemon's callback: it must not end the watch
                logger.exception("heartbeat callback failed")


def _fingerprint(path: Path) -> _Fingerprint:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)
