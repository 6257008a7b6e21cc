"""Appends that a full disk cannot merge into one line, and the full-disk error found behind others."""

import errno
import os

import pytest

from streams import disk
from streams.disk import append_line, disk_full, name_problem


class FillsAfter:
    """``os.write`` on a disk with ``room`` bytes left: a write beyond it is cut short, the next raises ENOSPC."""

    def __init__(self, room: int):
        self.room, self.real = room, os.write

    def __call__(self, fd: int, data) -> int:
        if self.room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = self.real(fd, bytes(data[: self.room]))
        self.room -= n
        return n


def test_a_cut_append_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    log = tmp_path / "batches.jsonl"
    append_line(log, '{"seq": 1}')
    monkeypatch.setattr(disk.os, "write", FillsAfter(5))
    with pytest.raises(OSError) as raised:
        append_line(log, '{"seq": 2, "episodes": ["a", "b"]}')
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(log)
    assert log.read_text() == '{"seq": 1}\n'  # not '{"seq": 1}\n{"seq"'
    monkeypatch.undo()
    append_line(log, '{"seq": 2}')
    assert log.read_text().splitlines() == ['{"seq": 1}', '{"seq": 2}']


def test_a_line_a_killed_writer_cut_off_is_removed_before_the_next(tmp_path):
    log = tmp_path / "ledger.txt"
    log.write_bytes(b"life/env-0-0-1\nlife/env-0-0-" + b"x" * 70_000)  # a tail longer than one read back
    append_line(log, "life/env-0-0-3")
    assert log.read_text().splitlines() == ["life/env-0-0-1", "life/env-0-0-3"]
    log.write_bytes(b"no newline at all")
    append_line(log, "first")
    assert log.read_text() == "first\n"


def test_a_line_with_a_newline_is_refused(tmp_path):
    with pytest.raises(ValueError, match="newline"):
        append_line(tmp_path / "x", "a\nb")


def test_the_full_disk_behind_other_errors_is_found():
    full = OSError(errno.ENOSPC, "No space left on device", "/runs/x/replay/batches.jsonl")
    try:
        try:
            raise full
        except OSError as error:
            raise RuntimeError("the spill failed") from error
    except RuntimeError as wrapped:
        group = ExceptionGroup("trio", [ValueError("other"), wrapped])
    assert disk_full(group) is full
    assert disk_full(OSError(errno.EACCES, "denied")) is None and disk_full(None) is None
    rust = RuntimeError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: \"No space\" })")
    assert disk_full(rust).errno == errno.ENOSPC  # safetensors' error names it only in its message
    assert str(disk.where_full(full, "/runs/x")) == "/runs/x/replay"


@pytest.mark.parametrize("name", ["main", "member_1", "v1.2-b"])
def test_plain_names_pass(name):
    assert name_problem("league member", name) is None


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../x", "/abs", "a b", "a\x00", "é"])
def test_names_that_are_not_plain_are_refused(name):
    assert "is not a name" in name_problem("league member", name)
