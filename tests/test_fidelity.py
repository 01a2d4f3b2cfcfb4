"""The published-measurement loader and the fit / leave-one-source-out assessment (on synthetic rows whose
"measurements" come from the model with known parameters, so the right answer is known)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from neuronmm_compiler.calibration.fidelity import assess, order_agreement, spearman
from neuronmm_compiler.calibration.published import COLUMNS, load_rows
from neuronmm_compiler.cost_model import DEFAULT_PARAMS
from neuronmm_compiler.errors import InputError
from neuronmm_compiler.targets import get_target

SHAPES = [(128, 512, 128), (512, 512, 512), (1024, 1024, 1024), (1024, 2048, 1024), (2048, 2048, 2048),
          (256, 4096, 1024)]
SCHEDULES = ["aws-tiled", "aws-block-free", "aws-fully-optimized"]


def _write(directory, truth=None, extra=()):
    """Three sources of GEMM rows on trn1; values are the model's own predictions under ``truth``."""
    directory.mkdir(exist_ok=True)
    rows = []
    for i, (m, n, k) in enumerate(SHAPES):
        for j, schedule in enumerate(SCHEDULES):
            source = f"src{(i + j) % 3}"
            rows.append([source, "https://example.com/x", "trn1", f"{schedule} {m}x{n}x{k}", m, n, k, "", "bfloat16",
                         "km", "gemm", schedule, "1", "us", ""])
    rows += list(extra)
    path = directory / "synthetic.csv"
    path.write_text(",".join(COLUMNS) + "\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))
    if truth is not None:  # replace the values by the model's predictions under the true parameters
        dataset = load_rows(directory)
        values = [f"{r.predict_us(truth):.6f}" for r in dataset.rows]
        lines = path.read_text().splitlines()
        out = [lines[0]]
        for line, value in zip(lines[1:], values, strict=False):
            cells = line.split(",")
            cells[12] = value
            out.append(",".join(cells))
        out += lines[1 + len(values):]
        path.write_text("\n".join(out) + "\n")
    return path


def test_rows_map_to_workloads_and_units_convert(tmp_path):
    extra = [["x", "https://example.com/y", "trn1", "rate", 1024, 1024, 1024, "", "bfloat16", "mk", "gemm",
              "aws-fully-optimized;tiles_in_block_m=4", "2", "TFLOPS", ""],
             ["x", "https://example.com/y", "trn1", "ms", 1024, 1024, 1024, "", "bfloat16", "mk", "gemm", "aws-tiled",
              "0.5", "ms", ""],
             ["x", "https://example.com/y", "trn1", "no knob", 1024, 1024, 1024, "", "bfloat16", "mk", "gemm",
              "unmapped", "0.5", "ms", "double-buffered accumulator"],
             ["x", "https://example.com/y", "trn1", "pct", 1024, 1024, 1024, "", "bfloat16", "mk", "gemm", "aws-tiled",
              "80", "percent", ""]]
    dataset = load_rows(_write(tmp_path / "d", extra=extra).parent)
    by_kernel = {r.kernel: r for r in dataset.rows}
    assert math.isclose(by_kernel["rate"].measured_us, 2 * 1024**3 / 2e12 * 1e6)
    assert by_kernel["rate"].params == {"tiles_in_block_m": "4"}
    assert by_kernel["ms"].measured_us == 500.0
    reasons = [why for _, why in dataset.skipped]
    assert any("double-buffered accumulator" in r for r in reasons) and any("percent" in r for r in reasons)
    assert len(dataset.digest) == 16


def test_a_bad_header_is_an_input_error(tmp_path):
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    with pytest.raises(InputError, match="header"):
        load_rows(tmp_path)
    with pytest.raises(InputError, match="no published measurements"):
        load_rows(tmp_path / "empty")


def test_the_fit_recovers_known_parameters_and_cross_validates(tmp_path):
    base = get_target("trn1")
    truth = dataclasses.replace(base, dma_fixed_cost_us=2.0,
                                params=dataclasses.replace(DEFAULT_PARAMS, tensor_engine_efficiency=0.8))
    dataset = load_rows(_write(tmp_path / "d", truth=truth).parent)
    result = assess(dataset.rows, base, ["dma_fixed_cost_us", "tensor_engine_efficiency"])
    assert math.isclose(result.fitted["dma_fixed_cost_us"], 2.0, rel_tol=1e-3)
    assert math.isclose(result.fitted["tensor_engine_efficiency"], 0.8, rel_tol=1e-3)
    default_median, _, _ = result.summary("default")
    _, held_max, n = result.summary("held_out")
    assert n == len(dataset.rows) and held_max < 1e-3 < default_median
    assert all(s.spearman is None or s.spearman > 0.99 for s in result.sources)
    assert all(s.ordered_right == s.ordered_pairs for s in result.sources)


def test_order_agreement_ignores_pairs_measured_too_close():
    # 100 and 101 are 1% apart: not counted; 100/150 and 101/150 are, and the prediction orders one of them right
    assert order_agreement([5.0, 3.0, 4.0], [100.0, 101.0, 150.0]) == (2, 1)
    assert order_agreement([1.0, 2.0, 3.0], [100.0, 101.0, 150.0]) == (2, 2)
    assert order_agreement([1.0, 1.0], [100.0, 200.0]) == (1, 0)  # a predicted tie orders nothing
    assert order_agreement([1.0, 2.0], [100.0, 101.0], separable=0.0) == (1, 1)


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2], [1, 2]) is None and spearman([1, 1, 1], [1, 2, 3]) is None
