"""The golden corpus: every case of tests/golden/cases.py emits exactly its stored kernel.

A refactor that preserves behaviour leaves all of them byte-identical; an intended change to emitted
code is regenerated with ``python scripts/update_golden.py --update`` and named in the commit.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from golden.cases import CASES
from neuronmm_compiler.cli import main as nmmc

KERNELS = Path(__file__).parent / "golden" / "kernels"
ROOT = Path(__file__).parents[1]


def test_corpus_is_large_and_complete():
    assert len(CASES) >= 60
    stored = {path.stem for path in KERNELS.glob("*.py")}
    assert stored == set(CASES), "stored kernels and cases differ; run scripts/update_golden.py --update"


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_kernel_is_byte_identical(name, monkeypatch):
    monkeypatch.chdir(ROOT)
    result = CliRunner().invoke(nmmc, list(CASES[name]), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    expected = (KERNELS / f"{name}.py").read_text()
    assert result.stdout == expected, f"{name}: emitted kernel changed (nmmc {' '.join(CASES[name])})"
