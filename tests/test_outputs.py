"""What nmmc writes, and what it refuses to write (issue 14, items 2, 3, 4, 7 and 12).

- Outputs named by the user (``-o``, ``--lock``, ``--report``, ``--storage``) are checked before any
  work; a path that cannot be written is one ``nmmc: error:`` line, exit code 2, nothing written.
- An existing output may be a regular file (replaced atomically) or a symbolic link (written
  through: the file it points to is replaced, the link stays); a directory, device, FIFO or socket
  is refused. New files get the umask's mode.
- ``nmmc tune`` writes the kernel, the lockfile, the report and the result cache entry only once
  all of them could be made.
- ``--storage`` is always checked; ``nmmc report`` never creates a storage it reads.
- A closed stdout (``nmmc targets | head -1``) exits quietly with 141, Ctrl-C with 130.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from neuronmm_compiler import io as nmmc_io
from neuronmm_compiler.cli import main
from neuronmm_compiler.errors import InputError

pytestmark = pytest.mark.usefixtures("one_polish_start")  # what surrounds a search, not the search (conftest.py)

SHAPE = ["--shape", "128x512x128"]  # an exhaustive search of about a second
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
NMMC = [sys.executable, "-c", "from neuronmm_compiler.cli import main; main()"]


def _tree(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() if p.is_file() else b"<dir>"
            for p in sorted(directory.rglob("*"))}


def _fails(args: list[str], cwd: Path, monkeypatch) -> str:
    """Run nmmc in ``cwd``; assert one error line, exit code 2 and no change under ``cwd``; the line."""
    monkeypatch.chdir(cwd)
    before = _tree(cwd)
    result = CliRunner().invoke(main, args)
    assert "Traceback" not in result.output
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert result.stdout == ""
    assert result.stderr.startswith("nmmc: error: ") and result.stderr.count("\n") == 1, result.stderr
    assert _tree(cwd) == before, "the failing command wrote something"
    return result.stderr.strip()


@pytest.fixture
def work(tmp_path, monkeypatch):
    """An empty working directory, with the result cache outside it."""
    directory = tmp_path / "work"
    directory.mkdir()
    monkeypatch.setenv("NMMC_CACHE_DIR", str(tmp_path / "cache"))
    return directory


def _cache_entries(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "cache").rglob("*.json"))


# ----------------------------------------------------------------------------- item 2: special files, symlinks


def test_a_fifo_is_refused_not_replaced(work, monkeypatch):
    fifo = work / "k.py"
    os.mkfifo(fifo)
    line = _fails(["emit", *SHAPE, "-o", "k.py"], work, monkeypatch)
    assert line == "nmmc: error: cannot write 'k.py': it is a FIFO, not a regular file"
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_a_socket_is_refused(tmp_path):
    path = tmp_path / "s.sock"
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(path))
        with pytest.raises(InputError, match="it is a socket, not a regular file"):
            nmmc_io.write_output(str(path), "x")
    finally:
        sock.close()
    assert stat.S_ISSOCK(path.lstat().st_mode)


def test_a_device_is_refused_before_anything_is_written(tmp_path):
    """/dev/null: as root an os.replace over it would replace the device node (checked on the path,
    so the test never touches the device)."""
    with pytest.raises(InputError, match=r"cannot write '/dev/null': it is a character device"):
        nmmc_io.check_output_file("/dev/null")
    with pytest.raises(InputError, match="character device"), nmmc_io.atomic_path("/dev/null"):
        raise AssertionError("atomic_path must refuse before yielding")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_an_existing_directory_is_refused(work, monkeypatch):
    (work / "k.py").mkdir()
    line = _fails(["emit", *SHAPE, "-o", "k.py"], work, monkeypatch)
    assert line == "nmmc: error: cannot write 'k.py': it is a directory, not a regular file"


def test_a_symlink_is_written_through_and_kept(work, monkeypatch):
    target = work / "kernels" / "real.py"
    target.parent.mkdir()
    target.write_text("old\n")
    (work / "link.py").symlink_to(Path("kernels") / "real.py")
    monkeypatch.chdir(work)
    result = CliRunner().invoke(main, ["emit", *SHAPE, "-o", "link.py"])
    assert result.exit_code == 0, result.output
    assert (work / "link.py").is_symlink() and os.readlink(work / "link.py") == str(Path("kernels") / "real.py")
    assert "nmmc-metadata" in target.read_text()
    assert sorted(p.name for p in target.parent.iterdir()) == ["real.py"]  # no temporary file left


def test_a_dangling_symlink_creates_its_target(tmp_path):
    (tmp_path / "link.json").symlink_to("real.json")
    nmmc_io.write_text_atomic(tmp_path / "link.json", "{}")
    assert (tmp_path / "link.json").is_symlink() and (tmp_path / "real.json").read_text() == "{}"


def test_a_symlink_to_a_device_is_refused(tmp_path):
    (tmp_path / "k.py").symlink_to("/dev/null")
    with pytest.raises(InputError, match="character device"):
        nmmc_io.write_output(str(tmp_path / "k.py"), "x")
    assert (tmp_path / "k.py").is_symlink()


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640)])
def test_kernel_files_get_the_umask_mode(work, monkeypatch, umask, mode):
    monkeypatch.chdir(work)
    old = os.umask(umask)
    try:
        emitted = CliRunner().invoke(main, ["emit", *SHAPE, "-o", "e.py"])
        tuned = CliRunner().invoke(main, ["tune", *SHAPE, "-o", "t.py", "--lock", "l.json"])
    finally:
        os.umask(old)
    assert emitted.exit_code == 0 and tuned.exit_code == 0, emitted.output + tuned.output
    for name in ("e.py", "t.py", "l.json"):
        assert stat.S_IMODE((work / name).stat().st_mode) == mode, name


# ----------------------------------------------------------------------------- item 3: no partial artifacts


def test_tune_checks_every_output_before_searching(work, tmp_path, monkeypatch):
    from neuronmm_compiler import driver

    def no_search(*args, **kwargs):
        raise AssertionError("searched before checking the outputs")

    monkeypatch.setattr(driver, "tune", no_search)
    line = _fails(["tune", "--shape", "256x512x256", "-o", "nodir/k.py", "--lock", "l.json", "--report", "rep"],
                  work, monkeypatch)
    assert line == "nmmc: error: cannot write 'nodir/k.py': directory 'nodir' does not exist"
    assert _cache_entries(tmp_path) == []


def test_a_late_failure_leaves_no_kernel_lock_report_or_cache_entry(work, tmp_path, monkeypatch):
    from neuronmm_compiler.artifacts import report as report_module
    from neuronmm_compiler.errors import NmmcError

    def failing_report(*args, **kwargs):
        raise NmmcError("the report could not be drawn")

    monkeypatch.setattr(report_module, "write_report", failing_report)
    line = _fails(["tune", *SHAPE, "-o", "k.py", "--lock", "l.json", "--report", "rep"], work, monkeypatch)
    assert line == "nmmc: error: the report could not be drawn"
    assert _cache_entries(tmp_path) == []


def test_a_failing_kernel_write_leaves_no_cache_entry(work, tmp_path, monkeypatch):
    real_replace = os.replace

    def failing_replace(src, dst):
        if str(dst).endswith("k.py"):
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(nmmc_io.os, "replace", failing_replace)
    line = _fails(["tune", *SHAPE, "-o", "k.py", "--lock", "l.json"], work, monkeypatch)
    assert line == "nmmc: error: cannot write 'k.py': No space left on device"
    assert _cache_entries(tmp_path) == []


def test_a_successful_tune_writes_everything_and_then_the_cache(work, tmp_path, monkeypatch):
    monkeypatch.chdir(work)
    (work / "rep").mkdir()
    (work / "rep" / "keep.txt").write_text("mine")
    result = CliRunner().invoke(main, ["tune", *SHAPE, "-o", "k.py", "--lock", "l.json", "--report", "rep"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in work.iterdir()) == ["k.py", "l.json", "rep"]
    assert sorted(p.name for p in (work / "rep").iterdir()) == [
        "history.png", "importance.png", "keep.txt", "roofline.png", "summary.md"]
    assert len(_cache_entries(tmp_path)) == 1
    again = CliRunner().invoke(main, ["tune", *SHAPE, "-o", "k2.py", "--report", "new"])
    assert again.exit_code == 0 and "answered from the cache" in again.output
    # answered from the cache, which keeps no trials: summary.md only, saying why (issue 28 item 5)
    assert sorted(p.name for p in (work / "new").iterdir()) == ["summary.md"]
    assert not [p for p in work.iterdir() if p.name.startswith(".")]


def test_a_malformed_lockfile_fails_before_the_search(work, monkeypatch):
    from neuronmm_compiler import driver

    monkeypatch.setattr(driver, "tune", lambda *a, **k: pytest.fail("searched"))
    (work / "l.json").write_text("{not json")
    line = _fails(["tune", *SHAPE, "-o", "k.py", "--lock", "l.json"], work, monkeypatch)
    assert "l.json: not a valid nmmc lockfile" in line


# ----------------------------------------------------------------------------- item 4: unwritable paths


@pytest.fixture
def plain_file(work):
    (work / "file").write_text("a regular file\n")
    return "file"


CASES = {
    "emit -o missing dir": (["emit", *SHAPE, "-o", "nodir/k.py"],
                            "cannot write 'nodir/k.py': directory 'nodir' does not exist"),
    "emit -o under a file": (["emit", *SHAPE, "-o", "file/k.py"],
                             "cannot write 'file/k.py': 'file' is not a directory"),
    "emit -o a directory": (["emit", *SHAPE, "-o", "."], "cannot write '.': it is a directory, not a regular file"),
    "tune -o under a file": (["tune", *SHAPE, "-o", "file/k.py"],
                             "cannot write 'file/k.py': 'file' is not a directory"),
    "tune -o a directory": (["tune", *SHAPE, "-o", "."], "cannot write '.': it is a directory, not a regular file"),
    "tune --lock missing dir": (["tune", *SHAPE, "-o", "k.py", "--lock", "nodir/l.json"],
                                "cannot write 'nodir/l.json': directory 'nodir' does not exist"),
    "tune --lock under a file": (["tune", *SHAPE, "-o", "k.py", "--lock", "file/l.json"],
                                 "cannot write 'file/l.json': 'file' is not a directory"),
    "tune --report missing dir": (["tune", *SHAPE, "-o", "k.py", "--report", "nodir/rep"],
                                  "cannot write 'nodir/rep': directory 'nodir' does not exist"),
    "tune --report a file": (["tune", *SHAPE, "-o", "k.py", "--report", "file"],
                             "cannot write to 'file': it exists and is not a directory"),
    "tune --model -o under a file": (["tune", "--model", "nomodel", "--tokens", "1", "-o", "file/m"],
                                     "cannot write 'file/m': 'file' is not a directory"),
    "tune --model -o a file": (["tune", "--model", "nomodel", "--tokens", "1", "-o", "file"],
                               "cannot write to 'file': it exists and is not a directory"),
    "compress -o missing dir": (["compress", "nomodel", "--keep-ratio", "0.5", "-o", "nodir/f"],
                                "cannot write 'nodir/f': directory 'nodir' does not exist"),
    "compress -o a file": (["compress", "nomodel", "--keep-ratio", "0.5", "-o", "file"],
                           "cannot write to 'file': it exists and is not a directory"),
    "report -o a file": (["report", "sqlite:///file", "-o", "file"],
                         "cannot write to 'file': it exists and is not a directory"),
    "report -o under a file": (["report", "sqlite:///file", "-o", "file/plots"],
                               "cannot write 'file/plots': 'file' is not a directory"),
    "calibrate -o under a file": (["calibrate", "missing.csv", "-o", "file/cal.json"],
                                  "cannot write 'file/cal.json': 'file' is not a directory"),
    "storage under a file": (["tune", *SHAPE, "-o", "k.py", "--storage", "sqlite:///file/s.db"],
                             "storage 'sqlite:///file/s.db': 'file' is not a directory"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_unwritable_outputs_are_one_error_line(work, plain_file, monkeypatch, name):
    args, message = CASES[name]
    assert _fails(args, work, monkeypatch) == f"nmmc: error: {message}"


def _deny_writes_to(directory: Path, monkeypatch) -> None:
    """os.access says ``directory`` cannot be written (as for a non-root user on a 0555 directory)."""
    real_access = os.access

    def access(path, mode, *args, **kwargs):
        if Path(path).resolve() == directory.resolve() and mode & os.W_OK:
            return False
        return real_access(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)


READ_ONLY = {
    "emit -o": (["emit", *SHAPE, "-o", "ro/k.py"], "cannot write 'ro/k.py': directory 'ro' is not writable"),
    "tune -o": (["tune", *SHAPE, "-o", "ro/k.py"], "cannot write 'ro/k.py': directory 'ro' is not writable"),
    "tune --lock": (["tune", *SHAPE, "-o", "k.py", "--lock", "ro/l.json"],
                    "cannot write 'ro/l.json': directory 'ro' is not writable"),
    "tune --report": (["tune", *SHAPE, "-o", "k.py", "--report", "ro/rep"],
                      "cannot write 'ro/rep': directory 'ro' is not writable"),
    "tune --model": (["tune", "--model", "nomodel", "--tokens", "1", "-o", "ro/m"],
                     "cannot write 'ro/m': directory 'ro' is not writable"),
    "compress": (["compress", "nomodel", "--keep-ratio", "0.5", "-o", "ro/f"],
                 "cannot write 'ro/f': directory 'ro' is not writable"),
    "report": (["report", "sqlite:///s.db", "-o", "ro/plots"],
               "cannot write 'ro/plots': directory 'ro' is not writable"),
    "sqlite storage": (["tune", *SHAPE, "-o", "k.py", "--storage", "sqlite:///ro/s.db"],
                       "storage 'sqlite:///ro/s.db': directory 'ro' is not writable"),
}


@pytest.mark.parametrize("name", list(READ_ONLY))
def test_read_only_directories_are_one_error_line(work, monkeypatch, name):
    (work / "ro").mkdir()
    (work / "s.db").write_bytes(b"")
    _deny_writes_to(work / "ro", monkeypatch)
    args, message = READ_ONLY[name]
    assert _fails(args, work, monkeypatch) == f"nmmc: error: {message}"


@pytest.mark.skipif(IS_ROOT, reason="root writes into a 0555 directory; covered above with os.access patched")
def test_a_really_read_only_directory(work, monkeypatch):
    (work / "ro").mkdir()
    (work / "ro").chmod(0o555)
    try:
        line = _fails(["emit", *SHAPE, "-o", "ro/k.py"], work, monkeypatch)
    finally:
        (work / "ro").chmod(0o755)
    assert line == "nmmc: error: cannot write 'ro/k.py': directory 'ro' is not writable"


def test_a_permission_error_while_writing_is_one_error_line(work, monkeypatch):
    """A write refused after the checks passed (a race, an ACL os.access does not see)."""
    real_open = open

    def refusing_open(file, mode="r", *args, **kwargs):
        if "x" in mode:
            raise PermissionError(13, "Permission denied")
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr("builtins.open", refusing_open)
    line = _fails(["emit", *SHAPE, "-o", "k.py"], work, monkeypatch)
    assert line == "nmmc: error: cannot write 'k.py': Permission denied"


# ----------------------------------------------------------------------------- item 7: --storage


def test_a_bad_storage_url_is_an_error_even_for_an_exhaustive_search(work, monkeypatch):
    line = _fails(["tune", *SHAPE, "--storage", "foo", "-o", "k.py"], work, monkeypatch)
    assert line.startswith("nmmc: error: unsupported storage URL 'foo'; accepted forms: sqlite:///PATH.db")


def test_an_unused_storage_is_noted(work, monkeypatch):
    monkeypatch.chdir(work)
    result = CliRunner().invoke(main, ["tune", *SHAPE, "--storage", "sqlite:///s.db", "-o", "k.py"])
    assert result.exit_code == 0, result.output
    assert result.stderr == ("nmmc: note: --storage sqlite:///s.db is unused: the exhaustive search keeps no "
                             "Optuna study (use --method optuna to record one)\n")
    assert not (work / "s.db").exists()


# ----------------------------------------------------------------------------- item 12: report, pipes, Ctrl-C


@pytest.mark.parametrize("url", ["sqlite:///missing.db", "journal:///missing.log", "sqlite:///nodir/missing.db"])
def test_report_of_a_missing_storage_creates_nothing(work, monkeypatch, url):
    line = _fails(["report", url, "-o", "plots"], work, monkeypatch)
    assert line.startswith(f"nmmc: error: storage {url!r}: no such file")


def test_a_closed_stdout_exits_quietly_with_141():
    """`nmmc targets | head -1`: the reader is gone before nmmc writes (closed right after start)."""
    process = subprocess.Popen([*NMMC, "targets"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    process.stdout.close()
    stderr = process.stderr.read()
    process.stderr.close()
    assert process.wait(timeout=120) == 141
    assert stderr == b""


def test_a_shell_pipe_into_head():
    command = " ".join(shlex.quote(word) for word in NMMC)
    result = subprocess.run(["bash", "-c", f"{command} targets | head -1; echo ${{PIPESTATUS[0]}} >&2"],
                            capture_output=True, text=True, timeout=120)
    assert result.stdout.startswith("trn1")
    assert result.stderr.strip() in ("0", "141")  # 0 when nmmc wrote everything before head exited


def test_ctrl_c_exits_130(monkeypatch):
    from neuronmm_compiler.cli import calibrate

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(calibrate, "targets_lines", interrupted)
    result = CliRunner().invoke(main, ["targets"])
    assert result.exit_code == 130
    assert result.stderr.strip() == "nmmc: interrupted"


def test_ctrl_c_during_a_search_exits_130_and_writes_nothing(tmp_path):
    """A real SIGINT while the search runs (its progress bar has started on stderr)."""
    env = {**os.environ, "NMMC_CACHE_DIR": str(tmp_path / "cache")}
    work = tmp_path / "work"
    work.mkdir()
    process = subprocess.Popen([*NMMC, "tune", "--shape", "2048x4096x2048", "--method", "optuna", "--trials",
                                "100000", "--progress", "-o", "k.py", "--lock", "l.json"], cwd=work, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        first = process.stderr.read(1)  # the progress bar: the search is running
        time.sleep(0.5)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert first and process.returncode == 130, (process.returncode, stderr[-500:])
    assert stderr.rstrip().endswith(b"nmmc: interrupted") and b"Traceback" not in stderr
    assert stdout == b""
    assert list(work.iterdir()) == []
    assert not list((tmp_path / "cache").rglob("*.json"))


def test_a_kernel_that_fails_verify_is_written_but_not_cached(work, tmp_path, monkeypatch):
    from types import SimpleNamespace

    import neuronmm_compiler.verification as verification

    failed = SimpleNamespace(ok=False, rel_error=1.0, error="wrong values", as_dict=lambda: {"ok": False})
    monkeypatch.setattr(verification, "verify_source", lambda *a, **k: failed)
    monkeypatch.chdir(work)
    result = CliRunner().invoke(main, ["tune", *SHAPE, "--verify", "-o", "k.py"])
    assert result.exit_code == 1, result.output
    assert "VERIFICATION FAILED" in result.output
    assert (work / "k.py").is_file()
    assert _cache_entries(tmp_path) == []
