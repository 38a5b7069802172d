"""Crash-safe writes of control files (accounting/durable.py): a write leaves the old file or
the new one, never a part; an exclusive create never replaces; gs:// writes carry generation
preconditions (on the GCS emulator, tests/gcs_emulator.py)."""
from __future__ import annotations

import errno
import os

import pytest
from gcs_emulator import storage_emulator

from accounting import durable


def test_a_write_replaces_whole_and_an_exclusive_create_never_replaces(tmp_path):
    path = str(tmp_path / "sub" / "control.json")
    assert durable.write_local(path, b"one", mode=0o600)
    assert open(path, "rb").read() == b"one" and os.stat(path).st_mode & 0o777 == 0o600
    assert durable.write_local(path, b"two")
    assert not durable.write_local(path, b"three", exclusive=True)
    assert open(path, "rb").read() == b"two"
    assert sorted(os.listdir(tmp_path / "sub")) == ["control.json"]  # no temporary file left
    assert durable.read(path) == (b"two", 1) and durable.read(path + ".x") == (None, 0)
    with pytest.raises(durable.GenerationMismatch):
        durable.write(path, b"four", generation=0)


def test_a_write_failing_half_way_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = str(tmp_path / "control.json")
    durable.write_local(path, b"old")
    real = os.fsync

    def full(fd):  # the disk fills while the new bytes are flushed
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError):
        durable.write_local(path, b"new, never whole")
    monkeypatch.setattr(os, "fsync", real)
    assert open(path, "rb").read() == b"old" and os.listdir(tmp_path) == ["control.json"]


def test_gcs_writes_are_conditional_on_the_generation_read():
    with storage_emulator("dp-durable") as bucket:
        uri = f"gs://{bucket}/control.json"
        first = durable.write(uri, b"one", generation=0)
        assert durable.read(uri) == (b"one", first)
        with pytest.raises(durable.GenerationMismatch):
            durable.write(uri, b"two", generation=0)
        second = durable.write(uri, b"two", generation=first)
        with pytest.raises(durable.GenerationMismatch):
            durable.write(uri, b"three", generation=first)  # another writer got there first
        assert durable.read(uri) == (b"two", second)
