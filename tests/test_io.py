"""neuronmm_compiler.io: atomic, durable writes that leave no temporary file behind."""

from __future__ import annotations

import os
import stat

import pytest

from neuronmm_compiler import io as nmmc_io
from neuronmm_compiler.errors import InputError


def test_text_and_bytes_are_written_whole(tmp_path):
    nmmc_io.write_text_atomic(tmp_path / "a.txt", "héllo\nworld\n")
    nmmc_io.write_bytes_atomic(str(tmp_path / "b.bin"), b"\x00\x01\xff")
    assert (tmp_path / "a.txt").read_bytes() == "héllo\nworld\n".encode()
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01\xff"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.bin"]


def test_replaces_an_existing_file(tmp_path):
    path = tmp_path / "out.json"
    path.write_text("old, longer content")
    nmmc_io.write_text_atomic(path, "new")
    assert path.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_new_files_get_the_umask_mode_not_0600(tmp_path):
    umask = os.umask(0o022)
    try:
        nmmc_io.write_text_atomic(tmp_path / "k.py", "x = 1\n")
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "k.py").stat().st_mode) == 0o644


def test_failure_leaves_no_temp_and_keeps_the_old_file(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("old")
    with pytest.raises(RuntimeError, match="boom"), nmmc_io.atomic_path(path) as tmp:
        tmp.write_text("half written")
        raise RuntimeError("boom")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_failure_in_the_write_itself_leaves_no_temp(tmp_path, monkeypatch):
    def failing_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(nmmc_io.os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        nmmc_io.write_text_atomic(tmp_path / "out.txt", "data")
    assert list(tmp_path.iterdir()) == []


def test_file_and_directory_are_fsynced(tmp_path, monkeypatch):
    synced: list[tuple[str, bool]] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        mode = os.fstat(fd).st_mode
        synced.append(("dir" if stat.S_ISDIR(mode) else "file", os.path.exists(tmp_path / "out.txt")))
        real_fsync(fd)

    monkeypatch.setattr(nmmc_io.os, "fsync", recording_fsync)
    nmmc_io.write_text_atomic(tmp_path / "out.txt", "data")
    # the file's data is made durable before the rename, then the rename itself
    assert synced == [("file", False), ("dir", True)]


def test_stale_temp_files_finds_what_an_interrupted_writer_left(tmp_path):
    final = tmp_path / "layer_001.safetensors"
    leftover = nmmc_io.temp_name(final)
    leftover.write_bytes(b"partial")
    (tmp_path / "layer_001.safetensors").write_bytes(b"complete")
    (tmp_path / ".unrelated.tmp").write_bytes(b"")
    assert nmmc_io.stale_temp_files(tmp_path, "layer_*.safetensors") == [leftover]


def test_write_output_reports_a_missing_directory(tmp_path):
    with pytest.raises(InputError, match=r"directory .* does not exist"):
        nmmc_io.write_output(str(tmp_path / "missing" / "k.py"), "x")
    nmmc_io.write_output(str(tmp_path / "k.py"), "x = 1\n")
    assert (tmp_path / "k.py").read_text() == "x = 1\n"
