"""The daemon's token file: ``<home>/token``, made by ``corral serve`` when no token is given,
readable by its owner only, and read back by the command line on the same machine.

Standard library only (and the errors): the command line reads it before any client exists.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

from corral.daemon._auth import sendable
from corral.daemon._errors import TokenFileError

TOKEN_FILE = "token"
DAEMON_PREFIX = "corral-daemon."
_MAX_BYTES = 4096  # far past any token; a bigger file is not one


def default_home() -> str:
    """Where the daemon keeps its state unless told: ``CORRAL_HOME``, else ``.corral`` (under
    the current directory)."""
    return os.environ.get("CORRAL_HOME") or ".corral"


def token_path(home: str | Path | None = None) -> Path:
    """The token file of the daemon whose state is in ``home`` (default: :func:`default_home`)."""
    return Path(default_home() if home is None else home) / TOKEN_FILE


def read_token_file(path: str | Path) -> str | None:
    """The token in the file at ``path``, or None when there is no such file.

    Raises :class:`TokenFileError` when the file is not one to trust: a symbolic link or not
    a regular file, owned by another user, readable or writable by group or others, empty
    or holding no single printable token.
    """
    path = Path(path)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if path.is_symlink():
            raise TokenFileError(
                str(path), "is a symbolic link", "replace it with the file itself"
            ) from None
        raise TokenFileError(str(path), f"cannot be read ({exc.strerror})", _REMAKE) from None
    try:
        _check_owned_and_private(fd, path)
        raw = os.read(fd, _MAX_BYTES + 1)
    finally:
        os.close(fd)
    return _token_of(raw, path)


def ensure_token_file(home: str | Path) -> tuple[str, Path]:
    """The daemon's token from ``<home>/token`` and the file's path; a new token is made when
    there is no file (32 random bytes, written where only its owner can read it).

    The file is made whole under a temporary name, with mode 0600 from its first byte, then
    linked into place: no other user can ever read it, no reader ever sees half a token,
    and of two daemons starting at once the second reads the first's. Raises
    :class:`TokenFileError` for a file that is there but cannot be trusted (see
    :func:`read_token_file`).
    """
    path = token_path(home)
    found = read_token_file(path)
    if found is not None:
        return found, path
    token = DAEMON_PREFIX + secrets.token_urlsafe(32)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        temporary = path.with_name(f".{TOKEN_FILE}.{secrets.token_hex(8)}.tmp")
        _write_new(temporary, token)
        try:
            os.link(temporary, path)
        except FileExistsError:
            pass  # another daemon was first: its token wins
        except OSError:  # no hard links on this file system: make the file itself
            with contextlib.suppress(FileExistsError):
                _write_new(path, token)
        finally:
            temporary.unlink(missing_ok=True)
        _sync_directory(path.parent)
    except OSError as exc:
        raise TokenFileError(
            str(path),
            f"cannot be made ({exc.strerror or exc})",
            "let this user write that directory, or give a token with --token / CORRAL_TOKEN",
        ) from None
    linked = read_token_file(path)
    if linked is None:  # removed in between by someone else: refuse rather than guess
        raise TokenFileError(str(path), "vanished as it was made", "start the daemon again")
    return linked, path


_REMAKE = "delete it to have a new token made at the daemon's next start"


def _write_new(path: Path, token: str) -> None:
    """Write ``token`` to a file that must not exist yet, mode 0600 from its creation."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        os.fchmod(fd, 0o600)  # a umask may only have taken bits away; say it exactly
        os.write(fd, (token + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _check_owned_and_private(fd: int, path: Path) -> None:
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise TokenFileError(str(path), "is not a regular file", _REMAKE)
    getuid = getattr(os, "getuid", None)
    if getuid is not None and info.st_uid != getuid():
        raise TokenFileError(
            str(path),
            f"is owned by user id {info.st_uid}, not by this user ({getuid()})",
            "run as its owner, or give the token with --token / CORRAL_TOKEN",
        )
    loose = stat.S_IMODE(info.st_mode) & 0o077
    if loose:
        raise TokenFileError(
            str(path),
            f"is open to group or others (mode {stat.S_IMODE(info.st_mode):04o})",
            f"chmod 600 {path} (and give out a new token: the old one may have been read), "
            f"or {_REMAKE}",
        )


def _token_of(raw: bytes, path: Path) -> str:
    if len(raw) > _MAX_BYTES:
        raise TokenFileError(str(path), f"is over {_MAX_BYTES} bytes: not a token", _REMAKE)
    try:
        text = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        text = ""
    if not text or not sendable(text):
        raise TokenFileError(
            str(path), "does not hold one token (printable ASCII, no spaces)", _REMAKE
        )
    return text


def _sync_directory(directory: Path) -> None:
    # The new name must survive a crash too; not every platform can open a directory.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
