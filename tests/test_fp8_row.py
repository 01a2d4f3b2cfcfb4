"""Per-token FP8 activation scales in the kernel (``--act-scale row``; docs/quantization.md, "Per-token activation
scales",
lowerings/row_scales.py): the kernels verify against the quantized graph in both layouts the search chooses between,
each scale the kernel computes is the graph's ``row_scale`` of the value it reduces bit for bit (fp32), the scale units
catch a row scale applied twice or not at all, the interpreter takes only the reductions nmmc emits, the cost model
counts what the interpreter runs, and what is not built is refused in one line. Small shapes: a few seconds."""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner

from neuronmm_compiler.cli import main as nmmc
from neuronmm_compiler.driver import compile_workload
from neuronmm_compiler.errors import KernelLimitError, UnsupportedAPIError
from neuronmm_compiler.frontends.shapes import Fp8Weights
from neuronmm_compiler.frontends.workloads import mlp_workload
from neuronmm_compiler.interpreter import run_kernel
from neuronmm_compiler.ir.evaluate import evaluate
from neuronmm_compiler.ir.fp8 import quantize, row_scale
from neuronmm_compiler.ir.quantized import calibrate, unquantized
from neuronmm_compiler.passes.quantize_fp8 import quantize_fp8
from neuronmm_compiler.targets import get_target
from neuronmm_compiler.verification import verify_source

ROW = Fp8Weights(act_scale="row")
#: the two layouts of gate/up and of the maxima: weights stationary with the maxima from the strips' TensorE
#: transposes, and activations stationary with the maxima reduced on the rows (x's row tile, each output tile)
FORMS = {"transposes": {"x_transpose": "dma"}, "rows": {"x_transpose": "pe", "stationary": "tokens"}}


@functools.cache
def _compiled(tokens: int = 8, hidden: int = 256, intermediate: int = 640, target: str = "trn2", ranks: tuple = (),
              **params: str):
    workload = mlp_workload(tokens, hidden, intermediate, ranks=ranks or None, dense=not ranks, fp8=ROW)
    return compile_workload(workload, target=get_target(target), params=params)


@pytest.mark.parametrize("case", [
    {"target": "trn2:lnc=2", "lnc_split": "gather"}, {"target": "trn2:lnc=2", "lnc_split": "features", **FORMS["rows"]},
    {"target": "trn2:lnc=2", "ranks": (128, 128, 128), "lnc_split": "hidden"}, {"tokens": 130, "token_tile": 64,
                                                                                 "tokens_per_block": 128},
], ids=["lnc2-gather", "lnc2-rows", "svd-hidden", "ragged-blocks"])
def test_row_scaled_kernels_verify_and_the_model_counts_what_runs(case: dict) -> None:
    compiled = _compiled(**case)
    report = verify_source(compiled.kernel.source, rules=True)
    assert report.ok, report.error
    assert report.rel_error is not None and report.rel_error < 1e-2
    source = compiled.kernel.source
    assert "x_rscale" in source and "h_rscale" in source
    if case.get("lnc_split") == "gather":  # h's features divided between the programs (5 tiles: overlapping shares)
        # each program reduces its half of h and the programs exchange the maxima, not h's fp32 strip
        assert "dst=h_rscale_other" in source and "sendrecv(src=h_strip" not in source
    cost, counters = compiled.cost, report.counters
    assert cost.dma_transfers == counters["dma_transfers"]
    assert cost.matmul_instructions == counters["matmul_instructions"]
    assert cost.transposes == counters["transposes"]
    assert cost.sbuf_bytes_per_partition == counters["sbuf_peak_bytes"]
    assert cost.psum_banks == counters["psum_peak_banks"]


_DEBUG = """    dbg_xs = nl.ndarray((T, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=dbg_xs[0:T, 0:1], src=x_rscale_cols[0:T, 0:1])
    dbg_hs = nl.ndarray((T, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=dbg_hs[0:T, 0:1], src=h_rscale_cols[0:T, 0:1])
    dbg_h = nl.ndarray((P, {tiles}, T), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=dbg_h[0:P, 0:{tiles}, 0:T], src=h_strip[0:P, 0:{tiles}, 0:T])
    dbg_xq = nl.ndarray((P, {x_tiles}, T), dtype=nl.float8_e4m3, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=dbg_xq[0:P, 0:{x_tiles}, 0:T], src=x_q_strip[0:P, 0:{x_tiles}, 0:T])
    return out, dbg_xs, dbg_hs, dbg_h, dbg_xq
"""


@pytest.mark.parametrize("form", list(FORMS))
def test_the_kernel_s_scales_are_the_graph_s_row_scale_bit_for_bit(form: str) -> None:
    """One core, one token block: the kernel also returns x's and h's scale columns, its fp32 h strip and its FP8 x
    strip. Each scale is ``ir.fp8.row_scale`` of what the kernel reduced, to the bit (x: the input itself; h: the
    kernel's own fp32 h, which differs from the float64 graph's by fp32 rounding only), and x_q is ``quantize``."""
    tokens, hidden, intermediate = 8, 256, 640
    source = _compiled(tokens, hidden, intermediate, **FORMS[form]).kernel.source
    reduced = "data=x_rows[0:T, 0:256]" if form == "rows" else "data=x_rscale_tpsum"
    assert f"nisa.tensor_scalar_reduce(dst=x_rscale_abs[0:T, 0:256], {reduced}" in source
    assert source.count("\n    return out\n") == 1
    tiles, x_tiles = -(-intermediate // 128), hidden // 128
    source = source.replace("\n    return out\n", "\n" + _DEBUG.format(tiles=tiles, x_tiles=x_tiles))
    graph = quantize_fp8(mlp_workload(tokens, hidden, intermediate, dense=True, fp8=ROW).graph())
    rng = np.random.default_rng(3)
    raw = {n.name: (rng.standard_normal(n.storage_shape) * (np.exp(2 * rng.standard_normal((tokens, 1)))
                                                           if n.name == "x" else 1)).astype(ml_dtypes.bfloat16)
           for n in unquantized(graph).inputs()}
    inputs = calibrate(graph, raw)
    names = [n.name for n in graph.inputs()]
    run = run_kernel(source, filename="<row>", kernel_name="dense_mlp_k0", args=[inputs[n] for n in names],
                     target=get_target("trn2"), arg_names=names)
    out, x_scale, h_scale, h_strip, x_q = run.outputs
    x = np.asarray(inputs["x"], dtype=np.float64)
    assert np.array_equal(np.asarray(x_scale, np.float64), row_scale(x, "float8_e4m3"))
    x_q_rows = np.asarray(x_q, np.float64).transpose(2, 1, 0).reshape(tokens, hidden)
    assert np.array_equal(x_q_rows, quantize(x, row_scale(x, "float8_e4m3"), "float8_e4m3"))
    h_kernel = np.asarray(h_strip, np.float64).transpose(2, 1, 0).reshape(tokens, -1)[:, :intermediate]
    assert np.array_equal(np.asarray(h_scale, np.float64), row_scale(h_kernel, "float8_e4m3"))
    want = evaluate(graph, inputs)["out"]
    assert np.linalg.norm(np.asarray(out, np.float64) - want) / np.linalg.norm(want) < 1e-2


_OUT_DEQUANT = "data=down_spill[0:T, 0:256], op0=nl.multiply, operand0=h_rscale_cols[0:T, 0:1])"
_ROW_MUTATIONS = {
    # the down projection's eviction forgets h's per-token scale
    "h row scale dropped": (_OUT_DEQUANT, "data=down_spill[0:T, 0:256], op0=nl.multiply, operand0=1.0)",
                            "row scale h_rscale_parts^-1"),
    "h row scale twice": (_OUT_DEQUANT, _OUT_DEQUANT.replace(
        ")", ", op1=nl.multiply, operand1=h_rscale_cols[0:T, 0:1])"), "row scale h_rscale_parts^+1"),
    # x multiplied by its scale instead of divided: the FP8 operand of gate/up carries the scale the wrong way
    "x quantized by a product": ("data2=x_rscale_bcast[0:F_TILE, 0:T], op=nl.divide",
                                 "data2=x_rscale_bcast[0:F_TILE, 0:T], op=nl.multiply", "row scale x_rscale_parts^+1"),
}


@pytest.mark.parametrize("mutation", list(_ROW_MUTATIONS))
def test_a_row_scale_applied_twice_or_not_at_all_fails_with_the_rule_id(mutation: str) -> None:
    old, new, units = _ROW_MUTATIONS[mutation]
    source = _compiled(**FORMS["transposes"]).kernel.source
    mutated = source.replace(old, new, 1)
    assert mutated != source
    report = verify_source(mutated)
    assert not report.ok and "NMMC-FP8-SCALE-ONCE" in (report.error or "") and units in report.error, report.error


_REDUCE = """import nki
import nki.isa as nisa
import nki.language as nl


@nki.jit
def reduce_kernel(x):
    t = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t[0:4, 0:8], src=x[0:4, 0:8])
    a = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.sbuf)
    r = nl.ndarray((4, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar_reduce(dst=a[0:4, 0:8], data=t[0:4, 0:8], op0=OP0, operand0=0.0, reduce_op=RED,
                              reduce_res=r[0:4, 0:1])
    m = nl.ndarray((4, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=m[0:4, 0:1], op=nl.maximum, data=t[0:4, 0:8], axis=AXIS)
    out = nl.ndarray((4, 2), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out[0:4, 0:1], src=r[0:4, 0:1])
    nisa.dma_copy(dst=out[0:4, 1:2], src=m[0:4, 0:1])
    return out
"""


def _reduce(op0: str = "nl.abs", red: str = "nl.maximum", axis: str = "1") -> np.ndarray:
    source = _REDUCE.replace("OP0", op0).replace("RED", red).replace("AXIS", axis)
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    out = run_kernel(source, filename="<reduce>", kernel_name="reduce_kernel", args=[x], target=get_target("trn2"))
    return x, out.outputs[0]


def test_the_interpreter_runs_the_reductions_nmmc_emits_and_refuses_others() -> None:
    x, out = _reduce()
    assert np.array_equal(out[:, 0], np.abs(x).max(axis=1)) and np.array_equal(out[:, 1], x.max(axis=1))
    with pytest.raises(UnsupportedAPIError, match=r"reduce_op=nl\.add"):
        _reduce(red="nl.add")
    with pytest.raises(UnsupportedAPIError, match="op0"):
        _reduce(op0="nl.exp")
    with pytest.raises(KernelLimitError, match="NKI-TENSOR-REDUCE"):
        _reduce(axis="0")


@pytest.mark.parametrize("args, message", [
    (["--dtype", "bf16", "--act-scale", "row"], "--act-scale row scales the activations of FP8 matmuls"),
    (["--dtype", "fp8", "--act-scale", "row", "--param", "mlp=split"], "mlp=split hands h to a second kernel"),
    (["--dtype", "fp8", "--act-scale", "row", "--tp", "2"], "--act-scale row is not sharded by --tp"),
    (["--dtype", "fp8", "--act-scale", "dynamic"], "--act-scale 'dynamic': accepted static, row"),
])
def test_what_is_not_built_is_refused_in_one_line(args: list[str], message: str, tmp_path) -> None:
    command = ["emit", "--mlp", "--tokens", "4", "--hidden", "256", "--intermediate", "512", "--dense", "--target",
               "trn2", *args, "-o", str(tmp_path / "k.py")]
    result = CliRunner().invoke(nmmc, command)
    assert result.exit_code == 2 and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "k.py").exists()
