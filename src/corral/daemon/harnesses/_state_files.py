"""Files a harness keeps for an agent in its state directory from one turn to the next (the
heartbeat file, a python turn's log), which the agent can change between and during turns.

The agent's code runs as the daemon's user and can write in that directory: whatever is
found at such a path is hostile until checked. :func:`made_empty` never opens a FIFO in a
way that blocks, never follows a symbolic link, and never writes to a file that has another
name (a hard link to one of the daemon's files, say): such a thing is removed and the file
made anew. A file that is already as it should be (a regular file of its own, empty) is kept
as it is, so that a turn costs one ``lstat`` rather than a file made and removed.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# Opened to be emptied only: not through a link, and without waiting for a FIFO's reader (a
# FIFO without one fails with ENXIO; with one it is opened, seen not to be a file and left).
_REOPEN = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def made_empty(path: Path) -> None:
    """Make ``path`` an empty regular file of its own (one link, mode 0600 when made),
    keeping the one found there when it is one (emptied when it holds anything); anything
    else there is removed first, and missing directories are made. Raises ``OSError``
    (a directory the agent put there, a full disk)."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
    else:
        if _own_file(found) and (found.st_size == 0 or _emptied(path)):
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    os.close(os.open(path, _CREATE, 0o600))


def _own_file(found: os.stat_result) -> bool:
    """A regular file with no other name: emptying it empties nothing else."""
    return stat.S_ISREG(found.st_mode) and found.st_nlink == 1


def _emptied(path: Path) -> bool:
    """Empty the file at ``path`` when it is (still, once opened) a regular file of its own;
    False when it is not, or cannot be opened."""
    try:
        fd = os.open(path, _REOPEN)
    except OSError:
        return False
    try:
        if not _own_file(os.fstat(fd)):
            return False
        os.ftruncate(fd, 0)
    finally:
        os.close(fd)
    return True
