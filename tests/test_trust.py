"""The model-error table (cost_model/trust.py) is what the published dataset says of the shipped model."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
from click.testing import CliRunner

from neuronmm_compiler.calibration.published import load_rows
from neuronmm_compiler.cli import main
from neuronmm_compiler.cost_model.trust import DATASET_DIGEST, MODEL_ERROR, RESULTS, trust_note
from neuronmm_compiler.targets import get_target, with_lnc

ROOT = Path(__file__).resolve().parents[1]
DATASET = ROOT / "benchmarks" / "published"


@pytest.fixture(scope="module")
def dataset():
    return load_rows(DATASET)


def test_the_table_is_the_shipped_models_error_on_the_published_rows(dataset):
    """Fails when the model or the data moves the figures: rerun benchmarks/fidelity.py and update trust.py.
    The table quotes the committed fidelity results (cross-validated where the shipped parameters were fitted
    to the rows); the shipped model's own error is recomputed here and must equal those results' "default"."""
    results = json.loads((ROOT / RESULTS).read_text())
    assert dataset.digest == DATASET_DIGEST == results["digest"]
    assert set(MODEL_ERROR) == {r.hardware for r in dataset.rows} == set(results["targets"])
    for name, entry in MODEL_ERROR.items():
        rows = [r for r in dataset.rows if r.hardware == name]
        errors = [abs(math.log(r.predict_us(get_target(name)) / r.measured_us)) for r in rows]
        summary = results["targets"][name]["summary"]
        assert summary["default"]["median_abs_log_ratio"] == pytest.approx(statistics.median(errors), abs=1e-6)
        assert summary["default"]["max_abs_log_ratio"] == pytest.approx(max(errors), abs=1e-6)
        assert entry.rows == len(rows) and entry.sources == len({r.source_id for r in rows})
        quoted = summary[entry.basis]
        assert entry.median_abs_log == pytest.approx(quoted["median_abs_log_ratio"], abs=1e-4)
        assert entry.max_abs_log == pytest.approx(quoted["max_abs_log_ratio"], abs=1e-4)


def test_fitted_targets_quote_their_cross_validated_error():
    """A target whose shipped parameters were fitted to the published rows must not quote its in-sample error."""
    from neuronmm_compiler.targets import TARGETS

    fitted = {name for name, t in TARGETS.items() if t.params is not None or t.dma_size_scale != 1.0}
    for name, entry in MODEL_ERROR.items():
        assert entry.basis == ("held_out" if name in fitted else "default"), name


def _one_polish_start(monkeypatch) -> None:
    """The notes tests below search only to print a result: one polish start (as conftest.one_polish_start, but for
    one test: the table test above keeps every start for its tuned rows)."""
    from neuronmm_compiler.search import tuner

    monkeypatch.setattr(tuner, "POLISH_STARTS", 1)


def test_every_prediction_says_how_far_to_trust_it(tmp_path, monkeypatch):
    _one_polish_start(monkeypatch)
    runner = CliRunner()
    note = trust_note(get_target("trn1"))
    assert note.startswith("typically within x") and "published trn1 measurements" in note
    assert "not validated: no published trn3 measurement" in trust_note(get_target("trn3"))
    emitted = runner.invoke(main, ["emit", "--shape", "256x512x256", "--target", "trn1", "-o", "-"]).output
    assert f"# model error  {note}" in emitted
    tuned = runner.invoke(main, ["tune", "--shape", "256x512x256", "--target", "trn1", "--trials", "5",
                                 "-o", str(tmp_path / "k.py")])
    assert tuned.exit_code == 0 and note in tuned.output
    cost = runner.invoke(main, ["cost", "--shape", "256x512x256", "--target", "trn3"]).output
    assert "model error      not validated" in cost


def test_targets_say_where_their_parameters_come_from_and_how_far_to_trust_them():
    from neuronmm_compiler.cost_model.trust import PROVENANCE
    from neuronmm_compiler.targets import TARGETS

    assert set(PROVENANCE) == set(TARGETS)
    out = CliRunner().invoke(main, ["targets"]).output
    assert f"dataset {DATASET_DIGEST}" in out
    blocks: dict[str, list[str]] = {}
    for line in out.splitlines():
        if not line.startswith("  "):
            blocks[line.split(":", 1)[0]] = []
        else:
            blocks[next(reversed(blocks))].append(line)
    assert set(blocks) == set(TARGETS)
    for name, lines in blocks.items():
        assert f"  parameters             {PROVENANCE[name]}" in lines
        assert f"  model error            {trust_note(with_lnc(get_target(name), None))}" in lines


def _doc_texts():
    return [(path.name, " ".join(path.read_text(encoding="utf-8").split()))
            for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]]


def test_every_doc_quotes_the_model_error_of_trust_py():
    """A doc quoting the model's error ("typically x1.53, worst x3.96", in any spelling of x) quotes
    one target's figures of trust.py (docs/tensor-parallel.md quoted a stale x1.25 / x1.51)."""
    import re

    from neuronmm_compiler.cost_model.trust import figures

    pairs = {(e.typical[1:], e.worst[1:]) for e in MODEL_ERROR.values()}
    typical = {t for t, _ in pairs}
    found = 0
    for name, text in _doc_texts():
        for a, b in re.findall(r"typically (?:within )?[x×](\d+\.\d+),? (?:worst )?[x×](\d+\.\d+)", text):
            assert (a, b) in pairs, f"{name} quotes x{a} / x{b}; trust.py says {[figures(t) for t in MODEL_ERROR]}"
            found += 1
        for a in re.findall(r"[x×](\d+\.\d+) typically", text):
            assert a in typical, f"{name} quotes a typical x{a}"
    assert found >= 3


def test_fused_workloads_say_the_band_was_validated_on_gemms(tmp_path, monkeypatch):
    """The published measurements are all of GEMM kernels: fused chains and MLPs say so next to the band."""
    _one_polish_start(monkeypatch)
    from neuronmm_compiler.cost_model.trust import FUSED_CAVEAT

    runner = CliRunner()
    mlp = ["--mlp", "--tokens", "16", "--hidden", "256", "--intermediate", "512", "--rank", "128"]
    for args in (["tune", *mlp, "--trials", "5", "-o", str(tmp_path / "m.py")],
                 ["tune", "--shape", "64x512x256", "--rank", "128", "--trials", "5", "-o", str(tmp_path / "c.py")],
                 ["cost", *mlp], ["explain", *mlp], ["emit", *mlp, "-o", str(tmp_path / "e.py")]):
        out = runner.invoke(main, args, catch_exceptions=False).output
        assert FUSED_CAVEAT in out, args
    cost = json.loads(runner.invoke(main, ["cost", *mlp, "--json"], catch_exceptions=False).output)
    assert cost["model_error"]["validated_on"] == "gemm" and FUSED_CAVEAT in cost["model_error"]["note"]
    gemm = runner.invoke(main, ["tune", "--shape", "128x512x256", "--trials", "5", "-o", str(tmp_path / "g.py")],
                         catch_exceptions=False).output
    assert "published trn2 measurements" in gemm and FUSED_CAVEAT not in gemm
