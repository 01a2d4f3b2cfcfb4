"""Issue 12 finding 4: the dialect x target x SDK support matrix and --dialect auto."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from neuronmm_compiler.cli import main
from neuronmm_compiler.errors import InputError, UnknownNameError
from neuronmm_compiler.support import (
    KNOWN_SDKS,
    LATER_SDKS,
    NEURONXCC_REMOVED_IN,
    NKI_LNC_FROM,
    REMOVAL_ANNOUNCEMENT,
    SUPPORT,
    check_sdk,
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
    ("trn2", "2.33", Dialect.NKI), ("trn3", "2.33", Dialect.NKI), ("trn2", "2.34", Dialect.NKI),
    ("trn3", "2.34", Dialect.NKI),
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
    """neuronxcc ends where NKI-NEURONXCC-IMPORT starts; nki is not on trn1 (NKI-DIALECT-TRN1) and starts with it,
    right after NKI-DIALECT-SDK's last release; the newest known release is nki's last, the one that removes
    neuronxcc.nki and brings nki.lnc (NKI-LNC-MODULE ends the release before)."""
    import_error = RULES_BY_ID["NKI-NEURONXCC-IMPORT"].sdk_min
    trn1_rule = RULES_BY_ID["NKI-DIALECT-TRN1"]
    too_early = RULES_BY_ID["NKI-DIALECT-SDK"].sdk_max
    assert RULES_BY_ID["NKI-NEURONXCC-REMOVED"].sdk_min == NEURONXCC_REMOVED_IN == KNOWN_SDKS[-1] == NKI_LNC_FROM
    assert RULES_BY_ID["NKI-ISA-LNC-DEPRECATED"].sdk_min == NKI_LNC_FROM and LATER_SDKS == ()
    assert KNOWN_SDKS.index(RULES_BY_ID["NKI-LNC-MODULE"].sdk_max) + 1 == KNOWN_SDKS.index(NKI_LNC_FROM)
    for entry in SUPPORT:
        assert entry.sdk_min in KNOWN_SDKS and entry.sdk_max in KNOWN_SDKS
        assert all(rule in RULES_BY_ID for rule in entry.rules)
        if entry.dialect is Dialect.NEURONXCC:
            assert KNOWN_SDKS.index(entry.sdk_max) + 1 == KNOWN_SDKS.index(import_error)
        else:
            assert "trn1" not in entry.targets and entry.sdk_min == trn1_rule.sdk_min
            assert KNOWN_SDKS.index(too_early) + 1 == KNOWN_SDKS.index(entry.sdk_min)
            assert entry.sdk_max == KNOWN_SDKS[-1] == "2.34"
    assert support_for(Dialect.NKI, "trn1") is None and newest_sdk(Dialect.NKI, "trn1") == KNOWN_SDKS[-1]
    assert newest_sdk(Dialect.NEURONXCC, "trn1") == "2.29"


def _emit(*args: str):
    return CliRunner().invoke(main, ["emit", "--shape", "256x512x256", "-o", "-", *args])


def test_emit_defaults_to_the_documented_dialect_and_says_where_it_runs():
    default = _emit()  # trn2, the default target, on its default logical core
    assert default.exit_code == 0 and "\nimport nki\n" in default.output and "nl.program_id(0)" in default.output
    trn1 = _emit("--target", "trn1")
    assert trn1.exit_code == 0 and "import neuronxcc.nki as nki" in trn1.output
    assert "# sdk          rules checked against Neuron SDK 2.26 to 2.29 on trn1" in trn1.output
    trn2 = _emit("--target", "trn2")
    assert "\nimport nki\n" in trn2.output and "Neuron SDK 2.29 to 2.34 on trn2" in trn2.output
    older = _emit("--target", "trn2", "--sdk", "2.28")
    assert "import neuronxcc.nki as nki" in older.output


def test_an_undocumented_pairing_warns_and_still_emits():
    result = _emit("--dialect", "nki", "--target", "trn1")
    assert result.exit_code == 0
    assert "nmmc: warning: the nki dialect is not documented for trn1 (NKI-DIALECT-TRN1" in result.output
    assert "not documented for trn1" in result.output and "nisa.dma_transpose" not in result.output
    late = _emit("--dialect", "neuronxcc", "--target", "trn2", "--sdk", "2.30")
    assert late.exit_code == 0 and "documented for trn2 on Neuron SDK 2.26 to 2.29, not on SDK 2.30" in late.output


def test_auto_without_a_documented_dialect_fails_before_writing(tmp_path):
    out = tmp_path / "k.py"
    result = CliRunner().invoke(main, ["emit", "--shape", "256x512x256", "--target", "trn1", "--sdk", "2.31",
                                       "-o", str(out)])
    assert result.exit_code == 2 and not out.exists()
    assert "no NKI dialect is documented for trn1 on Neuron SDK 2.31" in result.output


@pytest.mark.parametrize("command", ["emit", "tune"])
def test_sdk_2_34_refuses_neuronxcc_in_one_line(tmp_path, command):
    """Neuron 2.34 removes neuronxcc.nki: the legacy dialect is refused naming the announcement, and nothing is
    written; the nki dialect (and auto, which picks it) emits for 2.34."""
    out = tmp_path / "k.py"
    extra = ["--trials", "1"] if command == "tune" else []
    result = CliRunner().invoke(main, [command, "--shape", "256x512x256", "--target", "trn1", "--dialect", "neuronxcc",
                                       "--sdk", "2.34", "-o", str(out), *extra])
    assert result.exit_code == 2 and not out.exists(), result.output
    assert result.stderr.startswith("nmmc: error: Neuron SDK 2.34: ") and result.stderr.count("\n") == 1
    assert REMOVAL_ANNOUNCEMENT[1] in result.stderr and REMOVAL_ANNOUNCEMENT[0] in result.stderr
    trn1 = CliRunner().invoke(main, [command, "--shape", "256x512x256", "--target", "trn1", "--sdk", "2.34", "-o",
                                     str(out), *extra])
    assert trn1.exit_code == 2 and not out.exists() and trn1.stderr.count("\n") == 1
    assert "no NKI dialect is documented for trn1 on Neuron SDK 2.34" in trn1.stderr
    assert REMOVAL_ANNOUNCEMENT[1] in trn1.stderr
    for dialect in ("nki", "auto"):
        result = CliRunner().invoke(main, [command, "--shape", "256x512x256", "--target", "trn2", "--dialect", dialect,
                                           "--sdk", "2.34", "-o", str(out), *extra])
        assert result.exit_code == 0 and "Neuron SDK 2.29 to 2.34 on trn2" in out.read_text(), result.output
        out.unlink()


def test_check_sdk_accepts_2_34_for_nki_and_refuses_neuronxcc_there_with_the_reason():
    assert check_sdk("2.33") == "2.33" and check_sdk("2.34") == "2.34" and check_sdk("2.34", Dialect.NKI) == "2.34"
    assert check_sdk("2.29", Dialect.NEURONXCC) == "2.29"
    with pytest.raises(InputError, match=r"removes the neuronxcc\.nki namespace"):
        check_sdk("2.34", Dialect.NEURONXCC)
    with pytest.raises(InputError, match=r"unknown Neuron SDK release '2\.35'"):
        check_sdk("2.35", Dialect.NKI)


def test_a_kernel_that_exchanges_runs_on_the_releases_of_its_spelling():
    """NKI 0.8.0 (2.34) moves sendrecv to nki.lnc: a 2.34 kernel that exchanges runs on 2.34 only, one for 2.29-2.33
    (nisa.sendrecv) there only; a kernel without an exchange on the dialect's whole range."""
    from neuronmm_compiler.model_tuning.pipeline import sdk_range
    from neuronmm_compiler.support import kernel_range, support_note, uses_nki_lnc
    from neuronmm_compiler.targets import get_target, with_lnc

    assert [uses_nki_lnc(sdk) for sdk in ("2.29", "2.33", "2.34")] == [False, False, True]
    assert kernel_range(Dialect.NKI, "trn2", "2.34", exchanges=True) == ("2.34", "2.34")
    assert kernel_range(Dialect.NKI, "trn3", "2.30", exchanges=True) == ("2.29", "2.33")
    assert kernel_range(Dialect.NKI, "trn2", "2.30", exchanges=False) == ("2.29", "2.34")
    assert kernel_range(Dialect.NEURONXCC, "trn1", "2.29", exchanges=False) == ("2.26", "2.29")
    assert kernel_range(Dialect.NKI, "trn1", "2.34", exchanges=False) is None
    assert support_note(Dialect.NKI, "trn2", "2.34", exchanges=True) == "rules checked against Neuron SDK 2.34 on trn2"
    assert support_note(Dialect.NKI, "trn2") == "rules checked against Neuron SDK 2.29 to 2.34 on trn2"
    assert support_note(Dialect.NKI, "trn1").endswith("rules checked against Neuron SDK 2.34")
    # a model's kernels on a logical core of two programs may exchange: their range is the exchange's, conservatively
    trn2 = get_target("trn2")
    assert sdk_range("nki", with_lnc(trn2, 2)) == {"min": "2.34", "max": "2.34"}
    assert sdk_range("nki", with_lnc(trn2, 2), "2.33") == {"min": "2.29", "max": "2.33"}
    assert sdk_range("nki", trn2) == {"min": "2.29", "max": "2.34"}
    assert sdk_range("neuronxcc", get_target("trn1")) == {"min": "2.26", "max": "2.29"}
