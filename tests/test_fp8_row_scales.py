"""Dynamic per-row activation scales (``Fp8Weights(act_scale="row")``, ``--act-scale row``, docs/quantization.md) at
graph level:
the ``row_scale`` op, the ``quantize-fp8`` pass placing it, the reference and scale units of a row-scaled graph, the
option's plumbing and the kernel split the legality rules allow (the kernels: tests/test_fp8_row.py). Graph-level and
small: the file runs in about a second."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from neuronmm_compiler.codegen.reference import reference_source
from neuronmm_compiler.errors import InputError, ScheduleError
from neuronmm_compiler.frontends.shapes import Fp8Weights, mlp_graph
from neuronmm_compiler.frontends.workloads import mlp_workload, workload_from_dict
from neuronmm_compiler.ir import parse_text
from neuronmm_compiler.ir.evaluate import evaluate
from neuronmm_compiler.ir.fp8 import ROW_SCALE_FLOOR, quantize, row_scale
from neuronmm_compiler.ir.quantized import calibrate, scale_exponents, unquantized
from neuronmm_compiler.passes import DEFAULT_FUSION_PIPELINE, run_pipeline, split_kernels
from neuronmm_compiler.passes.legality import check_kernel
from neuronmm_compiler.passes.quantize_fp8 import quantize_fp8
from neuronmm_compiler.verification.reference import reference_chunks


def test_row_scale_is_each_rows_absmax_over_the_format_max_with_a_floor() -> None:
    x = np.array([[1.0, -480.0, 3.0], [0.0, 0.0, 0.0], [1e-9, 2e-9, -3e-9]])
    scale = row_scale(x, "float8_e4m3")
    assert scale.shape == (3, 1)
    assert scale[0, 0] == 2.0 and scale[1, 0] == scale[2, 0] == np.float32(ROW_SCALE_FLOOR)
    q = quantize(x, scale, "float8_e4m3")
    assert q[0, 1] == -240.0 and not q[1].any()  # the largest element of a row lands on the format's max


def _graph(ranks: tuple[int, int, int] | None = None, act_scale: str = "row"):
    return quantize_fp8(mlp_graph(4, 256, 384, ranks, fp8=Fp8Weights(act_scale=act_scale)))


def _inputs(graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    plain = unquantized(graph)
    raw = {n.name: rng.standard_normal(n.storage_shape).astype(ml_dtypes.bfloat16) for n in plain.inputs()}
    raw["x"] = (raw["x"].astype(np.float32) * np.array([[1.0], [0.0], [30.0], [1e-2]])).astype(ml_dtypes.bfloat16)
    return raw


@pytest.mark.parametrize("ranks", [None, (128, 128, 128)])
def test_the_pass_computes_every_activation_scale_on_chip(ranks) -> None:
    graph = _graph(ranks)
    assert parse_text(str(graph)) == graph
    assert not [n for n in graph.inputs() if n.name.endswith("_scale") and not n.name.startswith(("w_", "u_", "v_"))]
    rscales = [n for n in graph.nodes() if n.attrs.get("op") == "row_scale"]
    assert [n.id for n in rscales][:1] == ["x_rscale"] and all(n.shape == (4, 1) for n in rscales)
    assert "h_rscale" in {n.id for n in rscales}
    assert unquantized(graph) == mlp_graph(4, 256, 384, ranks)
    units = scale_exponents(graph)  # NMMC-FP8-SCALE-ONCE: each FP8 operand carries its row scale once, outputs none
    assert units["x_q"] == {"x_rscale": -1} and units["h_q"] == {"h_rscale": -1} and units["out"] == {}


def test_row_scales_follow_each_token_where_a_static_scale_cannot() -> None:
    """A zero token stays zero, and a token 3000 times smaller than another keeps its FP8 precision with row scales
    (its error vs the unquantized graph stays at FP8's few percent), while one static scale, set by the large token,
    flushes its intermediate to zero."""
    graph, static = _graph(), _graph(act_scale="static")
    raw = _inputs(graph)
    assert set(calibrate(graph, raw)) == set(raw) | {"w_gate_scale", "w_up_scale", "w_down_scale"}
    want = evaluate(unquantized(graph), raw)["out"]
    got_row = evaluate(graph, calibrate(graph, raw))["out"]
    got_static = evaluate(static, calibrate(static, raw))["out"]
    assert not got_row[1].any()

    def err(got: np.ndarray, token: int) -> float:
        return float(np.linalg.norm(got[token] - want[token]) / np.linalg.norm(want[token]))

    assert err(got_row, 3) < 0.15 < 0.5 < err(got_static, 3)
    assert err(got_row, 2) < 0.15


def test_the_reference_and_the_printed_reference_compute_row_scales() -> None:
    graph = _graph((128, 128, 128))
    inputs = calibrate(graph, _inputs(graph, seed=1))
    namespace: dict = {"np": np}
    exec("\n".join(reference_source(graph)), namespace)
    with np.errstate(over="ignore"):  # silu's exp(-v) of a large negative v: inf, and silu 0, as it should
        printed = namespace["reference"](*(inputs[n.name] for n in graph.inputs()))
    exact = evaluate(graph, inputs)["out"]
    assert np.array_equal(printed, exact)
    chunks = list(reference_chunks(graph, inputs, rows_per_chunk=1))  # cut by tokens: a row scale is per token
    assert np.array_equal(np.concatenate([c.values["out"] for c in chunks]), exact)


def test_the_option_is_carried_by_the_workload_and_refused_where_it_does_not_apply() -> None:
    from click.testing import CliRunner

    from neuronmm_compiler.cli import main

    workload = mlp_workload(4, 256, 384, dense=True, fp8=Fp8Weights(act_scale="row"))
    data = workload.to_dict()
    assert data["fp8"]["act_scale"] == "row" and workload_from_dict(data) == workload
    static = mlp_workload(4, 256, 384, dense=True, fp8=Fp8Weights()).to_dict()
    assert "act_scale" not in static["fp8"]  # earlier cache keys and lockfiles of FP8 MLPs are kept
    assert "row activation scales" in workload.describe()
    with pytest.raises(InputError, match="activation scales"):
        Fp8Weights(act_scale="token")
    result = CliRunner().invoke(main, ["cost", "--mlp", "--dense", "--tokens", "4", "--hidden", "256",
                                       "--intermediate", "384", "--dtype", "fp8", "--act-scale", "row"])
    assert result.exit_code == 0 and "row activation scales" in result.output  # kernels: tests/test_fp8_row.py


def test_a_row_scale_stays_in_the_kernel_that_quantizes_with_it() -> None:
    """mlp=whole: one kernel holds every row scale with its quantize and dequantize readers, whatever layouts they
    read it in; mlp=split would hand a row scale to another kernel through HBM, which the legality rules refuse."""
    marked = mlp_graph(4, 256, 384, None, fp8=Fp8Weights(act_scale="row"))
    (whole,) = split_kernels(run_pipeline(marked, DEFAULT_FUSION_PIPELINE).graph)
    check_kernel(whole, whole.name)
    split = run_pipeline(marked, DEFAULT_FUSION_PIPELINE.replace("fuse", "fuse{mlp=split}")).graph
    errors = []
    for kernel in split_kernels(split):
        try:
            check_kernel(kernel, kernel.name)
        except ScheduleError as err:
            errors.append(str(err))
    assert errors and all("per-token activation scale" in e for e in errors)
