#!/usr/bin/env python3
"""Measure the test suite's CPU seconds test by test and record them in tests/cpu_seconds.json.

tests/conftest.py reads that file: a test recorded at ``SLOW_SECONDS`` (conftest.py) or more gets the ``slow`` marker,
and so do the tests of its file that share its module fixtures, so ``pytest -m "not slow"`` is the quick subset for
the edit loop (README, docs/ci.md). Rerun this when tests were added or became slower:

    python scripts/suite_cpu.py                         # the whole suite as CI runs it; rewrites the file
    python scripts/suite_cpu.py tests/test_export.py    # these pytest arguments only; their files' entries replaced
    python scripts/suite_cpu.py -- -n 2 tests/test_x.py # pytest options go after --

A test's seconds are the user and system time of its test process over its setup, call and teardown, plus that of
the child processes it waited for (``getrusage``); a module fixture's cost lands on the first test that uses it. CPU
seconds rather than wall seconds: on a shared machine they move far less with the load. The file keeps the tests of
at least ``RECORD_SECONDS``. Prints the suite's total, the quick subset's and the slowest tests.

Loaded by pytest as a plugin (``-p suite_cpu``, with this directory on the path), the module records each test it
runs into ``$NMMC_SUITE_CPU_DIR``; run as a script, it starts that pytest and writes the file.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "tests" / "cpu_seconds.json"
#: Tests under this many CPU seconds are left out of the file (they are never slow).
RECORD_SECONDS = 0.1
SUITE = ["-n", "auto", "--dist", "loadfile"]
_VARIABLE = "NMMC_SUITE_CPU_DIR"


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """The plugin: append (node id, CPU seconds) of each test to this process's file in ``$NMMC_SUITE_CPU_DIR``."""
    directory = os.environ.get(_VARIABLE)
    started = _cpu_seconds()
    yield
    if directory:
        with open(Path(directory) / f"{os.getpid()}.jsonl", "a", encoding="utf-8") as out:
            out.write(json.dumps([item.nodeid, _cpu_seconds() - started]) + "\n")


def _conftest_threshold() -> float:
    """conftest.py's SLOW_SECONDS, read from its text (importing it would import the package's test helpers)."""
    for line in (ROOT / "tests" / "conftest.py").read_text(encoding="utf-8").splitlines():
        if line.startswith("SLOW_SECONDS = "):
            return float(line.split("=", 1)[1].split("#")[0])
    raise SystemExit("tests/conftest.py defines no SLOW_SECONDS")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pytest_args", nargs="*", help="pytest arguments (default: the whole suite, -n auto)")
    args = parser.parse_args()
    partial = bool(args.pytest_args)
    with tempfile.TemporaryDirectory(prefix="nmmc-suite-cpu-") as directory:
        env = {**os.environ, _VARIABLE: directory,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "scripts"), os.environ.get("PYTHONPATH")]))}
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "suite_cpu",
                   *(args.pytest_args or SUITE)]
        load = os.getloadavg()
        started = time.perf_counter()
        status = subprocess.run(command, cwd=ROOT, env=env).returncode
        wall = time.perf_counter() - started
        measured: dict[str, float] = {}
        for part in Path(directory).glob("*.jsonl"):
            for line in part.read_text(encoding="utf-8").splitlines():
                nodeid, seconds = json.loads(line)
                measured[nodeid] = seconds
    if status not in (0, 1) or not measured:
        print(f"pytest exited {status} having run {len(measured)} tests: {RECORD.name} not written", file=sys.stderr)
        return 2
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    run = {"pytest": " ".join(command[3:]), "commit": commit, "tests": len(measured),
           "cpu_seconds": round(sum(measured.values()), 1), "wall_seconds": round(wall, 1),
           "load_average_at_start": round(load[0], 2), "pytest_exit": status}
    fresh = {nodeid: round(s, 2) for nodeid, s in measured.items() if s >= RECORD_SECONDS}
    if partial and RECORD.is_file():  # the measured files' entries are replaced, the others kept
        record = json.loads(RECORD.read_text(encoding="utf-8"))
        files = {nodeid.split("::", 1)[0] for nodeid in measured}
        kept = {nodeid: s for nodeid, s in record["tests"].items() if nodeid.split("::", 1)[0] not in files}
        record["updated"] = [*record.get("updated", []), run]
        record["tests"] = dict(sorted({**kept, **fresh}.items()))
    else:
        record = {"about": "CPU seconds per test (user+sys of the test process and the children it waited for) of "
                           f"the tests of at least {RECORD_SECONDS} s, written by scripts/suite_cpu.py; "
                           "tests/conftest.py marks those of at least its SLOW_SECONDS slow",
                  "measured": run, "updated": [], "tests": dict(sorted(fresh.items()))}
    RECORD.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    threshold = _conftest_threshold()
    slow = {nodeid: s for nodeid, s in measured.items() if s >= threshold}
    total = sum(measured.values())
    print(f"{len(measured)} tests, {total:.0f} CPU s in {wall:.0f} s of wall time (pytest exit {status}, load "
          f"{load[0]:.1f} at the start); {len(slow)} at >= {threshold} s: {sum(slow.values()):.0f} s; the rest "
          f"(before module fixtures move): {total - sum(slow.values()):.0f} s. Wrote {RECORD.relative_to(ROOT)}")
    for nodeid, seconds in sorted(measured.items(), key=lambda kv: -kv[1])[:30]:
        print(f"  {seconds:7.2f}  {nodeid}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
