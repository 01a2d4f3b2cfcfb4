"""The pass test cases of this directory: each ``NAME.ir`` names its command on its first line,
``# RUN: nmmc opt ARGS``, and ``NAME.expected.ir`` holds exactly what that command prints.

In ARGS (split as a shell would), ``%s`` stands for the case file and ``%S`` for this directory.
Used by tests/test_opt.py and scripts/update_opt_golden.py.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from click.testing import CliRunner, Result

from neuronmm_compiler.cli import main as nmmc

CASE_DIR = Path(__file__).resolve().parent
RUN_PREFIX = "# RUN: nmmc opt"
EXPECTED_SUFFIX = ".expected.ir"


def case_files() -> list[Path]:
    """Every case's input file, sorted by name."""
    return sorted(path for path in CASE_DIR.glob("*.ir") if not path.name.endswith(EXPECTED_SUFFIX))


def expected_path(case: Path) -> Path:
    """Where the expected output of ``case`` is kept."""
    return case.with_name(case.name[: -len(".ir")] + EXPECTED_SUFFIX)


def run_args(case: Path) -> list[str]:
    """The ``nmmc`` arguments of ``case``'s RUN line (``opt`` first), substitutions made."""
    first = case.read_text().split("\n", 1)[0]
    if not first.startswith(RUN_PREFIX + " ") and first != RUN_PREFIX:
        raise ValueError(f"{case.name}: the first line must be '{RUN_PREFIX} ARGS'; got {first!r}")
    words = shlex.split(first[len("# RUN: nmmc "):])
    return [word.replace("%s", str(case)).replace("%S", str(CASE_DIR)) for word in words]


def run_case(case: Path) -> Result:
    """Run ``case``'s RUN line through the real command line (stdout and stderr kept apart)."""
    return CliRunner().invoke(nmmc, run_args(case), catch_exceptions=False)
