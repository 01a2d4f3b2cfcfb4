"""The model-error table (cost_model/trust.py) is what the published dataset says of the shipped model."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest
from click.testing import CliRunner

from neuronmm_compiler.calibration.published import load_rows
from neuronmm_compiler.cli import main
from neuronmm_compiler.cost_model.trust import DATASET_DIGEST, MODEL_ERROR, trust_note
from neuronmm_compiler.targets import get_target

DATASET = Path(__file__).resolve().parents[1] / "benchmarks" / "published"


@pytest.fixture(scope="module")
def dataset():
    return load_rows(DATASET)


def test_the_table_is_the_shipped_models_error_on_the_published_rows(dataset):
    """Fails when the model or the data moves the figures: rerun benchmarks/fidelity.py and update trust.py."""
    assert dataset.digest == DATASET_DIGEST
    assert set(MODEL_ERROR) == {r.hardware for r in dataset.rows}
    for name, entry in MODEL_ERROR.items():
        rows = [r for r in dataset.rows if r.hardware == name]
        errors = [abs(math.log(r.predict_us(get_target(name)) / r.measured_us)) for r in rows]
        assert entry.rows == len(rows) and entry.sources == len({r.source_id for r in rows})
        assert entry.median_abs_log == pytest.approx(statistics.median(errors), abs=1e-4)
        assert entry.max_abs_log == pytest.approx(max(errors), abs=1e-4)


def test_every_prediction_says_how_far_to_trust_it(tmp_path):
    runner = CliRunner()
    note = trust_note(get_target("trn1"))
    assert note.startswith("typically within x") and "published trn1 measurements" in note
    assert "not validated: no published trn3 measurement" in trust_note(get_target("trn3"))
    emitted = runner.invoke(main, ["emit", "--shape", "256x512x256", "-o", "-"]).output
    assert f"# model error  {note}" in emitted
    tuned = runner.invoke(main, ["tune", "--shape", "256x512x256", "--trials", "5", "-o", str(tmp_path / "k.py")])
    assert tuned.exit_code == 0 and note in tuned.output
    cost = runner.invoke(main, ["cost", "--shape", "256x512x256", "--target", "trn3"]).output
    assert "model error      not validated" in cost
