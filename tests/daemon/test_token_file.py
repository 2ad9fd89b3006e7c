"""The daemon's token file: made by ``serve`` when no token is given, owner-only from its
first byte, reused, and refused when anyone else could have read or replaced it; a real
``corral serve`` then refuses every request without a token, loopback included."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import stat
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from corral.daemon import ServeConfig, TokenFileError, read_token_file, token_path
from corral.daemon._token_file import DAEMON_PREFIX, ensure_token_file
from tests.support.front_door import BOUND_S, serve_env


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --- the file ----------------------------------------------------------------------------------


def test_a_new_token_is_owner_only_and_reused(tmp_path: Path) -> None:
    home = tmp_path / "state" / "home"
    token, path = ensure_token_file(home)
    assert path == home / "token"
    assert mode(path) == 0o600
    assert mode(home) == 0o700  # made by us: private too
    assert token.startswith(DAEMON_PREFIX)
    assert len(token) >= len(DAEMON_PREFIX) + 43  # 32 random bytes, URL-safe
    assert path.read_text() == token + "\n"
    assert ensure_token_file(home) == (token, path)
    assert read_token_file(path) == token
    assert [p.name for p in home.iterdir()] == ["token"]  # no temporary file left behind


def test_the_mode_does_not_depend_on_the_umask(tmp_path: Path) -> None:
    previous = os.umask(0)
    try:
        _, path = ensure_token_file(tmp_path)
    finally:
        os.umask(previous)
    assert mode(path) == 0o600


def test_an_existing_directory_is_left_as_it_is(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    ensure_token_file(tmp_path)
    assert mode(tmp_path) == 0o755


def test_a_token_written_by_hand_is_taken(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("  my-own-token-0123\n\n")
    path.chmod(0o600)
    assert ensure_token_file(tmp_path) == ("my-own-token-0123", path)


@pytest.mark.parametrize("loose", [0o640, 0o604, 0o620, 0o602, 0o644, 0o660])
def test_a_file_others_may_read_or_write_is_refused_and_kept(tmp_path: Path, loose: int) -> None:
    path = tmp_path / "token"
    path.write_text("a-token-others-have-seen\n")
    path.chmod(loose)
    for attempt in (lambda: ensure_token_file(tmp_path), lambda: read_token_file(path)):
        with pytest.raises(TokenFileError) as caught:
            attempt()
        error = caught.value
        assert error.code == "token_file_unsafe"
        assert f"mode {loose:04o}" in error.message
        assert f"chmod 600 {path}" in error.message
        assert "a-token-others-have-seen" not in error.message
    assert path.read_text() == "a-token-others-have-seen\n"  # refused, not replaced
    assert mode(path) == loose


def test_a_file_of_another_user_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, path = ensure_token_file(tmp_path)
    ours = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: ours + 1)
    with pytest.raises(TokenFileError) as caught:
        read_token_file(path)
    assert f"owned by user id {ours}, not by this user ({ours + 1})" in caught.value.message
    assert "--token" in caught.value.message


def test_a_symbolic_link_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "elsewhere"
    real.write_text("linked-token\n")
    real.chmod(0o600)
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "token").symlink_to(real)
    with pytest.raises(TokenFileError) as caught:
        ensure_token_file(tmp_path / "home")
    assert "symbolic link" in caught.value.message


@pytest.mark.parametrize(
    "content", [b"", b"\n  \n", b"two words\n", b"tab\there", b"\xff\xfe", b"x" * 5000]
)
def test_a_file_that_holds_no_token_is_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "token"
    path.write_bytes(content)
    path.chmod(0o600)
    with pytest.raises(TokenFileError) as caught:
        ensure_token_file(tmp_path)
    assert caught.value.code == "token_file_unsafe"
    assert path.read_bytes() == content


def test_a_directory_in_its_place_is_refused(tmp_path: Path) -> None:
    (tmp_path / "token").mkdir(mode=0o700)
    with pytest.raises(TokenFileError) as caught:
        ensure_token_file(tmp_path)
    assert "not a regular file" in caught.value.message


def test_no_file_reads_as_none(tmp_path: Path) -> None:
    assert read_token_file(tmp_path / "token") is None
    assert read_token_file(tmp_path / "missing" / "token") is None


def test_the_home_defaults_to_corral_home_else_dot_corral(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CORRAL_HOME", raising=False)
    assert token_path() == Path(".corral/token")
    assert ServeConfig().home == ".corral"
    monkeypatch.setenv("CORRAL_HOME", str(tmp_path))
    assert token_path() == tmp_path / "token"
    assert ServeConfig().home == str(tmp_path)
    assert token_path("given") == Path("given/token")
    assert ServeConfig(home="given").home == "given"


# --- a real corral serve ---------------------------------------------------------------------


@asynccontextmanager
async def corral_serve(tmp_path: Path, **env: str) -> AsyncIterator[tuple[str, str]]:
    """``corral serve`` in its own process with no token given: its URL and the line it
    printed; ended with SIGTERM, which must end it cleanly."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "corral.cli",
        "serve",
        "--port",
        "0",
        "--store",
        f"sqlite:///{tmp_path}/corral.db",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=serve_env(CORRAL_HOME=str(tmp_path / "home"), **env),
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), BOUND_S * 2)).decode()
        found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
        assert found, line
        yield found.group(1), line
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(proc.communicate(), BOUND_S * 2)
    assert proc.returncode == 0, stderr


async def test_corral_serve_refuses_a_request_without_a_token_on_loopback(tmp_path: Path) -> None:
    async with corral_serve(tmp_path) as (url, line):
        path = tmp_path / "home" / "token"  # CORRAL_HOME, as no --home was given
        assert f"bearer token in {path}" in line
        assert mode(path) == 0o600
        token = read_token_file(path)
        assert token is not None
        assert token not in line
        async with httpx.AsyncClient(base_url=url, timeout=BOUND_S) as anonymous:
            assert (await anonymous.get("/healthz")).status_code == 200
            assert (await anonymous.head("/healthz")).status_code != 401  # past the gate
            for method, route in [
                ("GET", "/agents"),
                ("POST", "/agents"),
                ("GET", "/events?format=json"),
                ("GET", "/decisions"),
                ("GET", "/tokens"),
                ("POST", "/mcp"),
                ("GET", "/openapi.json"),
            ]:
                answer = await anonymous.request(method, route)
                assert answer.status_code == 401, (method, route, answer.text)
                assert answer.headers["www-authenticate"] == "Bearer"
            wrong = {"authorization": f"Bearer {token}x"}
            assert (await anonymous.get("/agents", headers=wrong)).status_code == 401
        headers = {"authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=BOUND_S) as client:
            assert (await client.get("/agents")).status_code == 200
    # The next start takes the same token: what was given out keeps working.
    async with corral_serve(tmp_path) as (url, _):
        assert read_token_file(path) == token
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=BOUND_S) as client:
            assert (await client.get("/agents")).status_code == 200


async def test_corral_serve_will_not_start_on_a_token_file_others_can_read(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "token").write_text("seen-by-others\n")
    (home / "token").chmod(0o640)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "corral.cli",
        "serve",
        "--port",
        "0",
        "--store",
        f"sqlite:///{tmp_path}/corral.db",
        "--home",
        str(home),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=serve_env(),
    )
    out, err = await asyncio.wait_for(proc.communicate(), BOUND_S * 2)
    assert proc.returncode == 2, err
    assert out == b""
    message = err.decode()
    assert f"error token_file_unsafe: the token file {home / 'token'} is open to group" in message
    assert "chmod 600" in message
    assert "seen-by-others" not in message
    assert "Traceback" not in message
