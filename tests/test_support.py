"""Issue 12 finding 4: the dialect x target x SDK support matrix and --dialect auto."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from neuronmm_compiler.cli import main
from neuronmm_compiler.errors import InputError, UnknownNameError
from neuronmm_compiler.support import (
    KNOWN_SDKS,
    SUPPORT,
    newest_sdk,
    resolve_dialect,
    support_for,
    support_warning,
)
from neuronmm_compiler.verification.rules import RULES_BY_ID
from neuronmm_compiler.vocab import Dialect


@pytest.mark.parametrize(("target", "sdk", "expected"), [
    ("trn1", None, Dialect.NEURONXCC), ("trn2", None, Dialect.NKI), ("trn3", None, Dialect.NKI),
    ("trn1", "2.26", Dialect.NEURONXCC), ("trn1", "2.29", Dialect.NEURONXCC),
    ("trn2", "2.28", Dialect.NEURONXCC), ("trn2", "2.29", Dialect.NKI), ("trn2", "2.32", Dialect.NKI),
    ("trn3", "2.27", Dialect.NEURONXCC),
])
def test_auto_picks_the_documented_dialect(target, sdk, expected):
    assert resolve_dialect("auto", target, sdk) is expected
    assert support_warning(expected, target, sdk) is None


def test_no_documented_dialect_is_an_error_naming_the_ranges():
    with pytest.raises(InputError, match=r"no NKI dialect is documented for trn1 on Neuron SDK 2\.30"):
        resolve_dialect("auto", "trn1", "2.30")
    with pytest.raises(InputError, match=r"unknown Neuron SDK release '2\.99'"):
        resolve_dialect("auto", "trn2", "2.99")
    with pytest.raises(UnknownNameError, match="accepted: auto, nki, neuronxcc"):
        resolve_dialect("cuda", "trn2")


def test_the_matrix_agrees_with_the_rule_book():
    """neuronxcc ends where NKI-NEURONXCC-IMPORT starts; nki is not on trn1 (NKI-DIALECT-TRN1) and starts with it."""
    import_error = RULES_BY_ID["NKI-NEURONXCC-IMPORT"].sdk_min
    trn1_rule = RULES_BY_ID["NKI-DIALECT-TRN1"]
    for entry in SUPPORT:
        assert entry.sdk_min in KNOWN_SDKS and entry.sdk_max in KNOWN_SDKS
        assert all(rule in RULES_BY_ID for rule in entry.rules)
        if entry.dialect is Dialect.NEURONXCC:
            assert KNOWN_SDKS.index(entry.sdk_max) + 1 == KNOWN_SDKS.index(import_error)
        else:
            assert "trn1" not in entry.targets and entry.sdk_min == trn1_rule.sdk_min
    assert support_for(Dialect.NKI, "trn1") is None and newest_sdk(Dialect.NKI, "trn1") == KNOWN_SDKS[-1]
    assert newest_sdk(Dialect.NEURONXCC, "trn1") == "2.29"


def _emit(*args: str):
    return CliRunner().invoke(main, ["emit", "--shape", "256x512x256", "-o", "-", *args])


def test_emit_defaults_to_the_documented_dialect_and_says_where_it_runs():
    trn1 = _emit()
    assert trn1.exit_code == 0 and "import neuronxcc.nki as nki" in trn1.output
    assert "# sdk          rules checked against Neuron SDK 2.26 to 2.29 on trn1" in trn1.output
    trn2 = _emit("--target", "trn2")
    assert "\nimport nki\n" in trn2.output and "Neuron SDK 2.29 to 2.32 on trn2" in trn2.output
    older = _emit("--target", "trn2", "--sdk", "2.28")
    assert "import neuronxcc.nki as nki" in older.output


def test_an_undocumented_pairing_warns_and_still_emits():
    result = _emit("--dialect", "nki")
    assert result.exit_code == 0
    assert "nmmc: warning: the nki dialect is not documented for trn1 (NKI-DIALECT-TRN1" in result.output
    assert "not documented for trn1" in result.output and "nisa.dma_transpose" not in result.output
    late = _emit("--dialect", "neuronxcc", "--target", "trn2", "--sdk", "2.30")
    assert late.exit_code == 0 and "documented for trn2 on Neuron SDK 2.26 to 2.29, not on SDK 2.30" in late.output


def test_auto_without_a_documented_dialect_fails_before_writing(tmp_path):
    out = tmp_path / "k.py"
    result = CliRunner().invoke(main, ["emit", "--shape", "256x512x256", "--sdk", "2.31", "-o", str(out)])
    assert result.exit_code == 2 and not out.exists()
    assert "no NKI dialect is documented for trn1 on Neuron SDK 2.31" in result.output
