"""Files kept in an agent's state directory from turn to turn (``_state_files.made_empty``):
the agent can put anything at their paths between turns -- a FIFO (opening it would block the
daemon), a symbolic or hard link to another file (which must not be emptied), a directory --
and the daemon must end up with an empty regular file of its own there, or an error."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from corral.daemon.harnesses import _state_files
from corral.daemon.harnesses._state_files import made_empty


def _own_empty_file(path: Path) -> os.stat_result:
    found = os.lstat(path)
    assert stat.S_ISREG(found.st_mode)
    assert found.st_nlink == 1
    assert found.st_size == 0
    return found


def test_a_missing_file_is_made_with_its_directories(tmp_path: Path) -> None:
    path = tmp_path / "agents" / "a_1" / "state" / "heartbeat"
    made_empty(path)
    assert stat.S_IMODE(_own_empty_file(path).st_mode) & 0o077 == 0


def test_an_empty_file_of_its_own_is_kept_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "heartbeat"
    path.touch()
    before = os.lstat(path)
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    made_empty(path)
    after = _own_empty_file(path)
    assert after.st_ino == before.st_ino
    assert after.st_mtime_ns == 1_000_000_000  # not even written to


def test_a_file_of_its_own_holding_something_is_emptied_in_place(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"o5\nhello")
    before = os.lstat(path)
    made_empty(path)
    assert _own_empty_file(path).st_ino == before.st_ino


def test_a_fifo_is_replaced_without_being_opened(tmp_path: Path) -> None:
    path = tmp_path / "log"
    os.mkfifo(path)
    made_empty(path)  # would block forever if it opened the FIFO for writing
    _own_empty_file(path)


def test_a_symlink_is_replaced_and_its_target_left_as_it_is(tmp_path: Path) -> None:
    outside = tmp_path / "precious"
    outside.write_text("keep me")
    path = tmp_path / "log"
    path.symlink_to(outside)
    made_empty(path)
    _own_empty_file(path)
    assert outside.read_text() == "keep me"


def test_a_symlink_to_an_empty_file_is_replaced_too(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.touch()
    path = tmp_path / "heartbeat"
    path.symlink_to(outside)
    made_empty(path)
    assert os.lstat(path).st_ino != os.lstat(outside).st_ino
    _own_empty_file(path)


@pytest.mark.parametrize("content", [b"", b"keep me"])
def test_a_hard_link_to_another_file_is_replaced_and_that_file_left_as_it_is(
    tmp_path: Path, content: bytes
) -> None:
    outside = tmp_path / "precious"
    outside.write_bytes(content)
    path = tmp_path / "log"
    os.link(outside, path)
    made_empty(path)
    assert os.lstat(path).st_ino != os.lstat(outside).st_ino
    _own_empty_file(path)
    assert outside.read_bytes() == content


def test_a_directory_in_its_place_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "log"
    (path / "inside").mkdir(parents=True)
    with pytest.raises(IsADirectoryError):
        made_empty(path)
    assert (path / "inside").is_dir()


# What is found can change between the look (lstat) and the opening that empties it: the
# opening itself never blocks, follows a link or empties a file with another name.


def test_emptying_never_follows_a_symlink(tmp_path: Path) -> None:
    outside = tmp_path / "precious"
    outside.write_text("keep me")
    path = tmp_path / "log"
    path.symlink_to(outside)
    assert not _state_files._emptied(path)
    assert outside.read_text() == "keep me"


def test_emptying_never_blocks_on_a_fifo_nor_writes_to_it(tmp_path: Path) -> None:
    path = tmp_path / "log"
    os.mkfifo(path)
    assert not _state_files._emptied(path)  # no reader: the opening fails at once
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert not _state_files._emptied(path)  # a reader: opened, seen not to be a file
    finally:
        os.close(reader)


def test_emptying_never_empties_a_file_with_another_name(tmp_path: Path) -> None:
    outside = tmp_path / "precious"
    outside.write_text("keep me")
    path = tmp_path / "log"
    os.link(outside, path)
    assert not _state_files._emptied(path)
    assert outside.read_text() == "keep me"
