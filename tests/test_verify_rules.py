"""``nmmc verify`` runs the static NKI rule pass (verification/static_check.py) before the kernels, for the file's
dialect, its target (or ``--target``) and the Neuron SDK release ``--sdk`` (default: the release the file records it
was emitted for, where its code depends on one, else the newest that supports the dialect on the target,
support.newest_sdk): a violation fails verify with the rule id, the kernel line and the doc citation, in text and in
``--json``, on both backends."""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

from helpers import compile_gemm
from neuronmm_compiler.cli import main
from neuronmm_compiler.interpreter import run_kernel
from neuronmm_compiler.support import KNOWN_SDKS, LATER_SDKS, REMOVAL_ANNOUNCEMENT
from neuronmm_compiler.targets import get_target
from neuronmm_compiler.verification import verify_source
from neuronmm_compiler.verification.rules import RULES_BY_ID

TRN2 = get_target("trn2")
IMPORT_RULE = RULES_BY_ID["NKI-NEURONXCC-IMPORT"]


def run(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.fixture
def legacy_file(tmp_path: Path) -> Path:
    """A correct bf16 GEMM in the neuronxcc (NKI 0.1) dialect for trn2, column-major A (no transposing load)."""
    path = tmp_path / "legacy.py"
    path.write_text(compile_gemm(128, 512, 256, target=TRN2, dialect="neuronxcc", a_layout="km").kernel.source)
    return path


@pytest.fixture
def nki_file(tmp_path: Path) -> Path:
    path = tmp_path / "nki.py"
    path.write_text(compile_gemm(128, 512, 256, target=TRN2, dialect="nki", a_layout="km").kernel.source)
    return path


def _import_lines(path: Path) -> list[int]:
    return [i for i, line in enumerate(path.read_text().splitlines(), 1) if line.startswith("import neuronxcc")]


def test_default_sdk_is_the_newest_supporting_the_dialect(legacy_file: Path, nki_file: Path) -> None:
    legacy = json.loads(run("verify", str(legacy_file), "--json").output)
    assert legacy["ok"] is True and legacy["sdk"] == "2.29" and legacy["violations"] == []
    current = json.loads(run("verify", str(nki_file), "--json").output)
    assert current["ok"] is True and current["sdk"] == "2.34" and current["violations"] == []
    human = run("verify", str(legacy_file))
    assert human.exit_code == 0 and "NKI rules of Neuron SDK 2.29: no violation" in human.output


def test_a_violation_fails_verify_with_rule_line_and_citation(legacy_file: Path) -> None:
    lines = _import_lines(legacy_file)
    assert len(lines) == 3
    result = run("verify", str(legacy_file), "--sdk", "2.30")
    assert result.exit_code == 1, result.output
    out = result.output.splitlines()
    assert out[0].startswith("FAILED: ") and "NKI rules of Neuron SDK 2.30: 3 violations" in out[1]
    for line in lines:
        expected = f"  line {line}: NKI-NEURONXCC-IMPORT: "
        row = next(r for r in out if r.startswith(expected))
        assert row.endswith(f"[{IMPORT_RULE.citation}]")
    # the kernel itself still ran and matched
    assert any(r.startswith("  relative error") for r in out)


def test_json_lists_the_violations_and_the_sdk(legacy_file: Path) -> None:
    result = run("verify", str(legacy_file), "--sdk", "2.31", "--json")
    assert result.exit_code == 1
    report = json.loads(result.output)
    assert report["ok"] is False and report["sdk"] == "2.31" and report["rel_error"] < 1e-2
    assert [(v["rule"], v["line"]) for v in report["violations"]] == [
        ("NKI-NEURONXCC-IMPORT", line) for line in _import_lines(legacy_file)]
    assert all(set(v) == {"rule", "line", "message", "citation"} for v in report["violations"])
    assert all(v["citation"] == IMPORT_RULE.citation for v in report["violations"])
    assert "NKI rule violation" in report["error"]


def test_target_override_selects_the_rules(nki_file: Path) -> None:
    """An nki-dialect kernel checked for trn1, where NKI 0.3+ kernels are documented as unsupported."""
    report = json.loads(run("verify", str(nki_file), "--target", "trn1", "--json").output)
    assert report["target"] == "trn1" and report["sdk"] == "2.34"
    assert {v["rule"] for v in report["violations"]} == {"NKI-DIALECT-TRN1"}
    # an SDK before NKI 0.3 (2.28) does not bound the trn1 rule; it has no nki dialect at all (NKI-DIALECT-SDK)
    report = json.loads(run("verify", str(nki_file), "--target", "trn1", "--sdk", "2.28", "--json").output)
    assert {v["rule"] for v in report["violations"]} == {"NKI-DIALECT-SDK"} and report["ok"] is False


@pytest.mark.parametrize("sdk", ["2.26", "2.27", "2.28"])
def test_an_nki_kernel_on_an_sdk_before_2_29_fails(nki_file: Path, sdk: str) -> None:
    """Issue 28, item 8: the support matrix starts the nki dialect at SDK 2.29; verify --sdk 2.26 used to pass."""
    result = run("verify", str(nki_file), "--sdk", sdk)
    assert result.exit_code == 1, result.output
    import_line = nki_file.read_text().splitlines().index("import nki") + 1
    assert f"  line {import_line}: NKI-DIALECT-SDK: " in result.output
    assert run("verify", str(nki_file), "--sdk", "2.29").exit_code == 0


def test_sdk_2_34_refuses_a_neuronxcc_file_and_checks_an_nki_one(legacy_file: Path, nki_file: Path) -> None:
    """Neuron 2.34 removes neuronxcc.nki: one line on stderr naming the announcement, exit 2, before the kernel runs.
    An nki file is checked against 2.34's rules."""
    legacy = run("verify", str(legacy_file), "--sdk", "2.34")
    assert legacy.exit_code == 2 and legacy.stdout == "" and legacy.stderr.count("\n") == 1
    assert legacy.stderr.startswith("nmmc: error: Neuron SDK 2.34: it removes the neuronxcc.nki namespace "
                                    f"('{REMOVAL_ANNOUNCEMENT[1]}', {REMOVAL_ANNOUNCEMENT[0]})")
    current = json.loads(run("verify", str(nki_file), "--sdk", "2.34", "--json").output)
    assert current["ok"] is True and current["sdk"] == "2.34" and current["violations"] == []


@pytest.fixture(scope="module")
def exchanging() -> dict[str, str]:
    """A dense decode MLP on a trn2 logical core of two programs (lnc_split=hidden: the programs exchange partial
    sums), emitted for SDK 2.34 (the default) and 2.33."""
    from neuronmm_compiler.driver import compile_workload
    from neuronmm_compiler.frontends.workloads import mlp_workload
    from neuronmm_compiler.targets import with_lnc

    workload, target = mlp_workload(1, 512, 1024, dense=True), with_lnc(TRN2, 2)
    return {sdk or "default": compile_workload(workload, target=target, sdk=sdk, params={"lnc_split": "hidden"})
            .kernel.source for sdk in (None, "2.34", "2.33")}


def test_an_exchanging_kernel_is_spelled_and_verified_for_its_release(exchanging, tmp_path: Path) -> None:
    """2.34 (the default): nki.lnc.sendrecv without pipe_id, 'import nki.lnc', 'sdk' 2.34 in the metadata, a header
    range of 2.34 alone; 2.33: today's nisa.sendrecv(..., pipe_id=0), 'sdk' 2.33, 2.29 to 2.33. verify checks each
    against its recorded release by default and passes; against the other release it fails with the rule that
    separates them."""
    assert exchanging["default"] == exchanging["2.34"]
    new, old = exchanging["2.34"], exchanging["2.33"]
    assert "nki.lnc.sendrecv(" in new and "pipe_id" not in new and "nisa.sendrecv(" not in new
    assert "\nimport nki.lnc\n" in new and '"sdk":"2.34"' in new and "Neuron SDK 2.34 on trn2" in new
    assert "nisa.sendrecv(" in old and "pipe_id=0)" in old and "nki.lnc" not in old
    assert '"sdk":"2.33"' in old and "Neuron SDK 2.29 to 2.33 on trn2" in old
    # the two releases' files differ only where the exchange is spelled and where the release is recorded
    lines = [line for line in new.splitlines() if line != "import nki.lnc"]
    changed = [(a, b) for a, b in zip(old.splitlines(), lines, strict=True) if a != b]
    assert {a.split("(")[0].strip() for a, _ in changed if "sendrecv(" in a} == {"nisa.sendrecv"}
    assert all("sendrecv(" in a or a.startswith(("# sdk ", "# nmmc-metadata: ")) for a, _ in changed), changed
    for path, source, sdk, wrong, rule in ((tmp_path / "new.py", new, "2.34", "2.33", "NKI-LNC-MODULE"),
                                           (tmp_path / "old.py", old, "2.33", "2.34", "NKI-ISA-LNC-DEPRECATED")):
        path.write_text(source)
        report = json.loads(run("verify", str(path), "--json").output)
        assert report["ok"] is True and report["sdk"] == sdk and report["lnc"] == 2, report
        result = run("verify", str(path), "--sdk", wrong)
        assert result.exit_code == 1 and f": {rule}: " in result.output, result.output
        assert f"[{RULES_BY_ID[rule].citation}]" in result.output


def test_unknown_sdk_is_a_usage_error(legacy_file: Path) -> None:
    result = run("verify", str(legacy_file), "--sdk", "2.99")
    assert result.exit_code == 2 and result.stderr.startswith("nmmc: error: Invalid value for '--sdk'")
    assert result.stderr.count("\n") == 1


def test_help_documents_sdk() -> None:
    text = " ".join(run("verify", "--help").output.split())
    assert "--sdk [" + "|".join(KNOWN_SDKS + LATER_SDKS) + "]" in text
    assert "neuronxcc on trn1/trn2: 2.29" in text and "nki on trn2/trn3: 2.34" in text
    assert "the release the file was emitted for, where its header records one" in text
    assert "A neuronxcc file on 2.34 or later is refused with the reason: that release removes neuronxcc.nki" in text
    assert re.search(r"violated NKI rule", text)


def test_the_rules_run_before_the_simulator_backend_too(monkeypatch, legacy_file: Path) -> None:
    """--backend nki-simulator (a stand-in neuronxcc.nki whose simulate_kernel is nmmc's interpreter)."""
    names = ("neuronxcc", "neuronxcc.nki", "neuronxcc.nki.isa", "neuronxcc.nki.language")
    modules = {name: types.ModuleType(name) for name in names}
    for name, module in modules.items():
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(modules[parent], child, module)
        monkeypatch.setitem(sys.modules, name, module)
    ran = []

    def simulate_kernel(fn, *args):
        path = fn.__code__.co_filename
        ran.append(fn.__name__)
        result = run_kernel(Path(path).read_text(), filename=path, kernel_name=fn.__name__, args=list(args),
                            target=TRN2)
        return result.outputs[0]

    modules["neuronxcc.nki"].jit = lambda fn: fn
    modules["neuronxcc.nki"].simulate_kernel = simulate_kernel
    result = run("verify", str(legacy_file), "--backend", "nki-simulator", "--sdk", "2.30", "--json")
    report = json.loads(result.output)
    assert result.exit_code == 1 and ran == ["gemm_kernel"] and report["backend"] == "nki-simulator"
    assert {v["rule"] for v in report["violations"]} == {"NKI-NEURONXCC-IMPORT"}


def test_the_library_runs_the_rules_only_when_asked(legacy_file: Path) -> None:
    source = legacy_file.read_text()
    plain = verify_source(source)
    assert plain.ok and plain.sdk is None and plain.violations == []
    checked = verify_source(source, rules=True, sdk="2.30")
    assert not checked.ok and checked.sdk == "2.30" and len(checked.violations) == 3
