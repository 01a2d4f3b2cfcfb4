"""FP8 end to end (docs/quantization.md): the formats' rounding, the quantized MLP graph and its unquantized twin,
emitted
kernels that verify against the quantized graph, the rules FP8 kernels are held to (mutations fail verify with a
rule id), and the cost of FP8 bytes and double_row matmuls. Small shapes: the whole file runs in a few seconds."""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import pytest

from neuronmm_compiler.driver import compile_workload
from neuronmm_compiler.errors import IRError
from neuronmm_compiler.frontends.shapes import Fp8Weights, mlp_graph
from neuronmm_compiler.frontends.workloads import mlp_workload
from neuronmm_compiler.ir import parse_text
from neuronmm_compiler.ir.evaluate import evaluate
from neuronmm_compiler.ir.fp8 import FP8_FORMATS, round_fp8
from neuronmm_compiler.ir.quantized import calibrate, unquantized
from neuronmm_compiler.passes.quantize_fp8 import QuantizeFp8, quantize_fp8
from neuronmm_compiler.targets import get_target
from neuronmm_compiler.verification import verify_source


@pytest.mark.parametrize("dtype", list(FP8_FORMATS))
def test_round_fp8_is_ml_dtypes_round_to_nearest_even_after_clamping(dtype: str) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal(50_000) * np.exp2(rng.uniform(-24, 18, 50_000))
    fmax = FP8_FORMATS[dtype].max
    expected = np.clip(x, -fmax, fmax).astype(getattr(ml_dtypes, dtype)).astype(np.float64)
    assert np.array_equal(round_fp8(x, dtype), expected)
    assert float(ml_dtypes.finfo(getattr(ml_dtypes, dtype)).max) == fmax


@pytest.mark.parametrize("ranks", [None, (128, 128, 128)])
def test_fp8_mlp_graph_round_trips_and_quantizes_its_bf16_twin(ranks: tuple[int, int, int] | None) -> None:
    marked = mlp_graph(4, 256, 384, ranks, fp8=Fp8Weights())
    graph = quantize_fp8(marked)
    assert parse_text(str(marked)) == marked and parse_text(str(graph)) == graph
    plain = unquantized(graph)
    assert unquantized(marked) == plain
    assert not QuantizeFp8().apply(plain)  # nothing to quantize: unchanged
    with pytest.raises(IRError, match="quantize-fp8"):
        evaluate(marked, {n.name: np.zeros(n.storage_shape) for n in marked.inputs()})
    assert plain == mlp_graph(4, 256, 384, ranks)
    rng = np.random.default_rng(0)
    raw = {n.name: rng.standard_normal(n.storage_shape).astype(ml_dtypes.bfloat16) for n in plain.inputs()}
    quantized = calibrate(graph, raw)
    assert quantized["w_gate" if ranks is None else "u_gate"].dtype == np.dtype(ml_dtypes.float8_e4m3)
    got, want = evaluate(graph, quantized)["out"], evaluate(plain, raw)["out"]
    assert 0 < np.linalg.norm(got - want) / np.linalg.norm(want) < 0.2  # FP8 error: present, bounded


@functools.cache
def _kernel(tokens: int, scales: str = "row", **params: str) -> str:
    workload = mlp_workload(tokens, 256, 384, dense=True, fp8=Fp8Weights(scales=scales))
    return compile_workload(workload, target=get_target("trn2"), params=params).kernel.source


@pytest.mark.parametrize("scales", ["row", "tensor"])
def test_fp8_kernel_verifies_against_the_quantized_graph(scales: str) -> None:
    source = _kernel(3, scales)
    assert "perf_mode=nisa.matmul_perf_mode.double_row" in source and "dtype=nl.float8_e4m3" in source
    report = verify_source(source, rules=True)
    assert report.ok, report.error
    assert report.rel_error is not None and report.rel_error < 1e-2
    assert report.unquantized_rel_error is not None and report.unquantized_rel_error > report.rel_error
    assert report.counters["double_row_matmuls"] == report.counters["matmul_instructions"]


def test_double_row_with_column_tiling_fails_with_the_rule_id() -> None:
    source = _kernel(3)
    mutated = source.replace("perf_mode=nisa.matmul_perf_mode.double_row",
                             "tile_position=(0, 0), tile_size=(128, 32), perf_mode=nisa.matmul_perf_mode.double_row", 1)
    report = verify_source(mutated)
    assert not report.ok and "NKI-MATMUL-TILE" in (report.error or "")


def test_double_row_needs_fp8_operands_and_a_v3_core() -> None:
    bf16 = compile_workload(mlp_workload(3, 256, 384, dense=True), target=get_target("trn2")).kernel.source
    mutated = "\n".join(line[:-1] + ", perf_mode=nisa.matmul_perf_mode.double_row)"
                         if line.lstrip().startswith("nisa.nc_matmul(") else line for line in bf16.splitlines())
    assert mutated != bf16
    report = verify_source(mutated)
    assert not report.ok and "NKI-MATMUL-DOUBLE-ROW" in (report.error or "")
    report = verify_source(_kernel(3), target=get_target("trn1"))
    assert not report.ok and "NKI-MATMUL-DOUBLE-ROW" in (report.error or "")


# the gate's and up's scales are combined once per kernel, on the eviction of the weight scales' transposes
# (lowerings/fused_epilogue.py, ScaleFold): gate's applied by silu's scale=, up's carrying h's division by h_scale
_GATE_SCALES = "data=w_gate_scale_tpsum[0:P, 0:3], op0=nl.multiply, operand0=x_scale_col[0:P, 0:1])"
_OUT_DEQUANT = "op0=nl.multiply, operand0=h_scale_col[0:T, 0:1])"
_UP_SCALES = "op0=nl.multiply, operand0=x_scale_col[0:P, 0:1], op1=nl.divide, operand1=h_scale_col[0:P, 0:1])"
_SCALE_MUTATIONS = {
    # a second x_scale in the gate's combined scale: silu reads gate * x_scale
    "gate x_scale twice": (_GATE_SCALES, _GATE_SCALES.replace(")", ", op1=nl.multiply, "
                                                              "operand1=x_scale_col[0:P, 0:1])"), "x_scale^+1"),
    "gate x_scale dropped": (_GATE_SCALES, "data=w_gate_scale_tpsum[0:P, 0:3], op0=nl.multiply, operand0=1.0)",
                             "x_scale^-1"),
    "out h_scale twice": (_OUT_DEQUANT, "op0=nl.multiply, operand0=h_scale_col[0:T, 0:1], op1=nl.multiply, "
                          "operand1=h_scale_col[0:T, 0:1])", "h_scale^+1"),
    "out h_scale dropped": (_OUT_DEQUANT, "op0=nl.multiply, operand0=1.0)", "h_scale^-1"),
    # h stored into its FP8 strip without the division by h_scale: the down matmul's FP8 operand carries no scale
    "h not quantized": (_UP_SCALES, "op0=nl.multiply, operand0=x_scale_col[0:P, 0:1])", "no scale"),
}


@pytest.mark.parametrize("mutation", list(_SCALE_MUTATIONS))
def test_a_scale_applied_twice_or_not_at_all_fails_with_the_rule_id(mutation: str) -> None:
    """Rule NMMC-FP8-SCALE-ONCE: the interpreter follows each value's scale units and names the scale."""
    old, new, units = _SCALE_MUTATIONS[mutation]
    source = _kernel(3)
    mutated = source.replace(old, new, 1)
    assert mutated != source
    report = verify_source(mutated)
    assert not report.ok and "NMMC-FP8-SCALE-ONCE" in (report.error or "") and units in report.error, report.error


def test_an_unclamped_fp8_write_fails_with_the_rule_id() -> None:
    source = _kernel(3)
    unclamped = source.replace("op1=nl.minimum, operand1=240.0", "op1=nl.multiply, operand1=1000.0", 1)
    assert unclamped != source
    report = verify_source(unclamped)
    assert not report.ok and "NKI-FP8-SATURATE" in (report.error or "")


def test_fp8_halves_weight_bytes_and_double_row_halves_pe_cycles() -> None:
    target = get_target("trn2")
    fp8 = compile_workload(mlp_workload(1, 512, 1024, dense=True, fp8=Fp8Weights()), target=target).cost
    bf16 = compile_workload(mlp_workload(1, 512, 1024, dense=True), target=target).cost
    assert fp8.hbm_bytes_read_by_tensor["w_gate"] * 2 == bf16.hbm_bytes_read_by_tensor["w_gate"]
    assert fp8.engine_us["tensor"] < 0.6 * bf16.engine_us["tensor"]


def test_the_printed_reference_computes_the_quantized_graph() -> None:
    from neuronmm_compiler.codegen.reference import reference_source

    graph = quantize_fp8(mlp_graph(4, 256, 384, (128, 128, 128), fp8=Fp8Weights("float8_e5m2", "tensor")))
    rng = np.random.default_rng(2)
    raw = {n.name: rng.standard_normal(n.storage_shape).astype(ml_dtypes.bfloat16) for n in unquantized(graph).inputs()}
    inputs = calibrate(graph, raw)
    namespace: dict = {"np": np}
    exec("\n".join(reference_source(graph)), namespace)
    printed = namespace["reference"](*(inputs[n.name] for n in graph.inputs()))
    assert np.array_equal(printed, evaluate(graph, inputs)["out"])


def test_fp8_decode_loads_each_channel_scale_once_and_dequantizes_k_blocked_rows_on_eviction() -> None:
    """A decode FP8 kernel: a per-channel scale read by a transposed group arrives in one contiguous DMA (then a
    TensorE transpose), not one DMA per 128 channels; the down projection streams its weight rows in K blocks as the
    bf16 kernel does, double_row, with the dequantization on the eviction; and it verifies."""
    source = _kernel(1, k_tiles_per_block=1, x_transpose="pe")
    loads = [line for line in source.splitlines() if "dma_copy(" in line and "src=w_gate_scale" in line]
    assert len(loads) == 1 and "w_gate_scale.ap(pattern=[[P, 3], [1, P]], offset=0)" in loads[0]
    assert "nisa.nc_transpose(dst=w_gate_scale_tpsum" in source
    assert "weight rows in blocks of 1 K tiles" in source
    matmuls = [line for line in source.splitlines() if "nisa.nc_matmul(" in line]
    assert matmuls and all("double_row" in line for line in matmuls)
    report = verify_source(source, rules=True)
    assert report.ok, report.error
    assert report.rel_error is not None and report.rel_error < 1e-2


def test_fp8_after_the_norm_prologue_quantizes_the_float32_normalized_x_and_verifies() -> None:
    """--fuse-norm with --dtype fp8 (rmsnorm_quant before the MLP): the residual sum is stored in bf16 and normalized
    as stored; the normalized x stays float32 until its quantization, so the kernel holds the quantized graph's FP8
    values exactly (an xn rounded to bf16 first moves some elements by a whole FP8 step)."""
    from neuronmm_compiler.frontends.prologue import NormPrologue

    prologue = NormPrologue("rmsnorm", residual=True)
    workload = mlp_workload(4, 256, 384, dense=True, fp8=Fp8Weights(), prologue=prologue)
    source = compile_workload(workload, target=get_target("trn2")).kernel.source
    assert "xn_strip = nl.ndarray((P, 2, T), dtype=nl.float32" in source
    assert "xn_q_strip = nl.ndarray((P, 2, T), dtype=nl.float8_e4m3" in source
    report = verify_source(source, rules=True)
    assert report.ok and report.rel_error is not None and report.rel_error < 5e-3, report.error
    quant = "op0=nl.divide, operand0=xn_scale_col[0:F_TILE, 0:1], op1=nl.minimum"
    twice = source.replace(quant, "op0=nl.divide, operand0=xn_scale_col[0:F_TILE, 0:1], op1=nl.divide, "
                           "operand1=xn_scale_col[0:F_TILE, 0:1])\n        "
                           "nisa.tensor_scalar(dst=xn_q_spill[0:F_TILE, 0:T], "
                           "data=xn_q_spill[0:F_TILE, 0:T], op0=nl.minimum, operand0=240.0, op1=nl.minimum", 1)
    assert twice != source
    report = verify_source(twice)
    assert not report.ok and "NMMC-FP8-SCALE-ONCE" in (report.error or ""), report.error
    assert "xn_scale^-2" in report.error


def test_an_fp8_dense_mlp_is_compared_with_nmmc_s_own_bf16_dense_mlp(tmp_path) -> None:
    """A user choosing FP8 compares it with the unquantized MLP nmmc would emit otherwise, not only with AWS's
    tutorial kernels: `tune` tunes the bf16 twin alike and prints the ratio, a loss included, with where the
    accuracy cost is measured."""
    import json

    from click.testing import CliRunner

    from neuronmm_compiler.cli import main

    args = ["tune", "--mlp", "--dense", "--tokens", "4", "--hidden", "256", "--intermediate", "384", "--dtype", "fp8",
            "--target", "trn2", "--trials", "4", "--no-progress", "-o", str(tmp_path / "k.py")]
    data = json.loads(CliRunner().invoke(main, [*args, "--json"], catch_exceptions=False).stdout)
    twin, fp8 = data["baselines"]["nmmc-dense"], data["predicted"]
    assert twin["computation"] == "dense MLP without FP8 (nmmc's fused kernel, tuned)"
    assert "w_down_scale" not in twin["hbm_bytes_read_by_tensor"]  # the unquantized graph: bf16 weights, no scales
    assert data["speedups"]["nmmc-dense"] == pytest.approx(twin["latency_us"] / fp8["latency_us"])
    text = CliRunner().invoke(main, args, catch_exceptions=False).stdout
    assert "dense MLP without FP8 (nmmc's fused kernel, tuned)" in text
    assert "speedup vs nmmc's fused dense MLP without FP8 (FP8's accuracy cost:" in text


def test_fp8_svd_intermediate_split_reduces_the_projection_of_h() -> None:
    """lnc_split=intermediate on an FP8 SVD MLP divides the contraction of h_q @ U_down between the programs (partial
    sums exchanged, then dequantized and requantized), as for bf16: not the first group reading a value with an
    epilogue, which under FP8 is x_q @ U_gate (its epilogue only rescales). So u_down crosses HBM once."""
    from neuronmm_compiler.targets import with_lnc

    workload = mlp_workload(1, 512, 1024, rank=128, fp8=Fp8Weights())
    compiled = compile_workload(workload, target=with_lnc(get_target("trn2"), 2), dialect="nki",
                                params={"lnc_split": "intermediate"})
    source = compiled.kernel.source
    assert "h_ud_acc_partial = " in source and "x_ug_acc_partial" not in source
    assert compiled.cost.hbm_bytes_read_by_tensor["u_down"] == 1024 * 128  # once, over both programs
    report = verify_source(source, rules=True)
    assert report.ok, report.error


def test_the_gated_fp8_eviction_combines_its_scales_once_per_kernel() -> None:
    """The eviction of h (transposed group): gate's scales applied by silu's own scale= (read from PSUM), up's
    dequantization carrying h's quantization (one ScalarE multiply by s_w * s_x / s_h, combined once per kernel), and
    only the clamp left of the quantization: 2 VectorE and 2 ScalarE instructions per tile instead of 5 and 1
    (lowerings/fused_epilogue.py)."""
    source = _kernel(3)
    lines = [line.strip() for line in source.splitlines()]
    h_group = [line for line in lines if "0:F_TILE, 0:T]" in line and ("act_f32" in line or "up_f32" in line
                                                                        or "h_f32" in line or "h_q_strip" in line)]
    vector = [line for line in h_group if line.startswith(("nisa.tensor_scalar(", "nisa.tensor_tensor("))]
    assert len(vector) == 2, h_group
    assert any(line.startswith("nisa.activation(dst=act_f32") and "data=gate_acc_psum" in line
               and "scale=w_gate_scale_cols" in line for line in h_group)
    assert any(line.startswith("nisa.activation(dst=up_f32") and "op=nl.copy" in line
               and "scale=w_up_scale_cols" in line for line in h_group)
    assert "op0=nl.divide, operand0=h_scale_col" not in source  # the division is in up's combined column
    # combined on the transposes' evictions: no instruction of their own
    assert sum(line.startswith("nisa.tensor_scalar(dst=w_up_scale_cols") and "data=w_up_scale_tpsum" in line
               for line in lines) == 1
    assert "_dequant_cols" not in source


def test_fp8_hidden_split_quantizes_each_programs_half_of_x_without_exchanging_it() -> None:
    """lnc_split=hidden: each program contracts gate and up over its half of the hidden dimension, so it quantizes
    only that half of x and keeps it (no exchange of x_q's strip); the partial sums are the one exchange. Before,
    only lnc_split=intermediate kept a value halved, and under FP8 it did so by picking x_q @ W_gate as the group
    the gated value feeds (test_fp8_svd_intermediate_split_reduces_the_projection_of_h)."""
    from neuronmm_compiler.targets import with_lnc

    workload = mlp_workload(1, 512, 1024, dense=True, fp8=Fp8Weights())
    compiled = compile_workload(workload, target=with_lnc(get_target("trn2"), 2), dialect="nki",
                                params={"lnc_split": "hidden"})
    source = compiled.kernel.source
    assert source.count("nki.lnc.sendrecv(") == 1 and "h_q_partials" in source
    report = verify_source(source, rules=True)
    assert report.ok, report.error


def test_folded_fp8_epilogue_allocates_no_unused_tile():
    """A folded FP8 epilogue leaves its fp32 scratch and the gate's temporary unused: the lowering drops their
    allocations (kernel_ir/prune.py), so the kernel neither prints nor counts them."""
    from neuronmm_compiler.kernel_ir.program import Alloc, Loop
    from neuronmm_compiler.kernel_ir.prune import drop_unused_allocs
    from neuronmm_compiler.targets import get_target

    compiled = compile_workload(mlp_workload(128, 512, 1024, ranks=(256, 256, 256), fp8=Fp8Weights("float8_e4m3")),
                                target=get_target("trn2"))
    source = compiled.kernel.source
    for name in {line.split(" = nl.ndarray")[0].strip() for line in source.splitlines() if " = nl.ndarray" in line}:
        assert source.count(f"{name}[") >= 1, name  # every allocated tile is read or written

    def allocs(body):
        return [s for s in body if isinstance(s, Alloc)] + [a for s in body if isinstance(s, Loop)
                                                           for a in allocs(s.body)]

    program = compiled.program
    assert drop_unused_allocs(program) is program  # nothing left to drop
    assert len(allocs(program.body)) == len({a.buffer for a in allocs(program.body)})
