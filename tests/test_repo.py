"""The project's contract: README commands, CI script, docs."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S)]


def test_ci_runs_exactly_the_readme_test_command():
    """.ci/run may only set the shell up, change directory and source service setup from .ci/; its
    last line is the README's test command, verbatim."""
    commands = _readme_commands()
    assert len(commands) >= 2, "README must show the install+run and the test commands"
    lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert lines[-1] == commands[1]
    for line in lines[:-1]:
        assert line.startswith(("set ", "cd ", "source .ci/")), line
        if line.startswith("source .ci/"):
            assert (ROOT / line.split()[1]).is_file()


def test_readme_main_command_tunes_and_verifies():
    main_command = _readme_commands()[0]
    assert "pip install ." in main_command and "nmmc tune --shape" in main_command
    assert "nmmc verify" in main_command


def test_docs_exist():
    for doc in ("architecture.md", "nki-subset.md"):
        assert (ROOT / "docs" / doc).read_text().strip()


def test_readme_says_how_long_the_suite_takes_what_it_skips_and_how_to_reactivate():
    """A new user reads, before running the suite: its duration on 2 cores (and that load lengthens it),
    that the PostgreSQL storage tests are skipped without a server (and how to run them), and that a new
    shell needs the venv activated again."""
    text = " ".join((ROOT / "README.md").read_text().split())
    assert re.search(r"about \d+(\.\d+)? minutes on an idle 2-core machine", text) and "longer when other work" in text
    assert "skipped unless `NMMC_TEST_POSTGRES_URL`" in text and "`.ci/run` starts" in text
    assert "NMMC_TEST_POSTGRES_URL=postgresql://" in text
    storage = (ROOT / "tests" / "test_storage.py").read_text()
    assert "NMMC_TEST_POSTGRES_URL" in storage and (ROOT / ".ci" / "postgres.sh").is_file()
    assert "in a new shell, run `. .venv/bin/activate` again" in text
    assert '`pytest -q -n auto -m "not slow"` runs the quick subset' in text  # the slow marker: tests/conftest.py


def test_each_test_process_runs_one_blas_thread_unless_told_otherwise():
    """conftest.py sets OPENBLAS_NUM_THREADS (and OMP_NUM_THREADS) before numpy is imported: numpy's OpenBLAS runs
    the variable's number of threads (one unless the caller set it), not one per core, which oversubscribed the
    machine with a test worker per core."""
    import numpy  # noqa: F401  (loads OpenBLAS, if nothing has yet)
    from threadpoolctl import threadpool_info

    assert os.environ.get("OMP_NUM_THREADS")
    blas = [pool for pool in threadpool_info() if pool["internal_api"] == "openblas"]
    assert blas and {pool["num_threads"] for pool in blas} == {int(os.environ["OPENBLAS_NUM_THREADS"])}
