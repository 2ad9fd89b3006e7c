"""The memory libpq holds for a result (``PQresultMemorySize``): an upper bound on the wire bytes
of its values, in one call, where counting them asks psycopg for a copy of every value. Found
in the libpq psycopg itself runs on; where it cannot be found, there is no bound (None)."""

from __future__ import annotations

import ctypes
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg.pq.abc import PGresult

__all__ = ["has_memory_size", "memory_size"]

_Size = Callable[[int], int]


def _bind(lib: Any) -> _Size | None:
    try:
        function = lib.PQresultMemorySize  # libpq 12 and later
    except AttributeError:
        return None
    function.argtypes = [ctypes.c_void_p]
    function.restype = ctypes.c_size_t
    size: _Size = function
    return size


def _loaded(path: Path) -> bool:
    # Only a library already mapped into the process is psycopg's: opening another copy
    # would read its results with a layout that may not be theirs.
    try:
        return str(path) in Path("/proc/self/maps").read_text()
    except OSError:
        return False


def _find() -> _Size | None:
    impl = psycopg.pq.__impl__
    if impl == "python":
        from psycopg.pq import _pq_ctypes  # psycopg's own handle on libpq

        return _bind(getattr(_pq_ctypes, "pq", None))
    if impl != "binary" or not sys.platform.startswith("linux"):
        return None
    spec = importlib.util.find_spec("psycopg_binary")
    if spec is None or spec.origin is None:
        return None
    libs = Path(spec.origin).parent.parent / "psycopg_binary.libs"
    for path in sorted(libs.glob("libpq*.so*")):
        if _loaded(path):
            return _bind(ctypes.CDLL(str(path)))
    return None


try:
    _SIZE = _find()
except (OSError, ImportError):
    _SIZE = None


def has_memory_size() -> bool:
    """Whether :func:`memory_size` can be called."""
    return _SIZE is not None


def memory_size(result: PGresult) -> int:
    """The bytes libpq holds for ``result``, at least the sum of its values' lengths on the
    wire (only where :func:`has_memory_size`)."""
    return _SIZE(result.pgresult_ptr)  # type: ignore[attr-defined,misc]
